"""Compiled kernels and their ABI tags: what a `.so` was built against, and whether a host matches.

A kernel folder in a playbook holds `kernel.json` (name, op library, sources). A build writes the
same `kernel.json` plus a `build` section (python tag, torch, CUDA or "cpu", C++11 ABI flag, arch
list, platform, the library's file name and sha256) next to the `.so`, under
/var/cache/fleetspec/kernels/<name>-<source hash>-<torch tag>/. A `.so` only loads into the torch it
was built against, so preflight refuses any host whose facts differ, naming both values.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from fleetspec.errors import ConfigError, UserError

KERNEL_JSON = "kernel.json"
KERNEL_CACHE = Path(os.environ.get("FLEETSPEC_CACHE", "/var/cache/fleetspec")) / "kernels"


@dataclass(frozen=True)
class KernelSpec:
    root: Path
    name: str
    library: str
    ops: tuple[str, ...]
    sources: tuple[str, ...]
    cuda_sources: tuple[str, ...] = ()

    @property
    def op_names(self) -> tuple[str, ...]:
        return tuple(f"{self.library}::{op}" for op in self.ops)

    def source_sha256(self) -> str:
        """One hash over kernel.json's source fields and every source file, in a fixed order."""
        h = hashlib.sha256()
        h.update(json.dumps([self.name, self.library, list(self.ops)]).encode())
        for rel in sorted(self.sources + self.cuda_sources):
            h.update(rel.encode() + b"\0" + (self.root / rel).read_bytes() + b"\0")
        return h.hexdigest()


@dataclass(frozen=True)
class Abi:
    python_tag: str
    torch: str
    cuda: str  # "cpu" or the CUDA version torch was built with
    cxx11_abi: bool
    platform: str
    arch_list: tuple[str, ...] = ()


@dataclass(frozen=True)
class Kernel:
    spec: KernelSpec
    abi: Abi
    library_file: str
    sha256: str
    source_sha256: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def path(self) -> Path:
        return self.spec.root / self.library_file

    def file_bytes(self) -> dict[str, bytes]:
        """The built library by file name, checked against its recorded sha256."""
        data = self.path.read_bytes()
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise ConfigError(self.spec.root / KERNEL_JSON, "build.sha256",
                              f"the sha256 of {self.library_file} (it changed since the build)")
        return {self.library_file: data}

    def to_json(self) -> dict:
        return {**_spec_json(self.spec), "build": {
            "python_tag": self.abi.python_tag, "torch": self.abi.torch, "cuda": self.abi.cuda,
            "cxx11_abi": self.abi.cxx11_abi, "platform": self.abi.platform,
            "arch_list": list(self.abi.arch_list), "library_file": self.library_file,
            "sha256": self.sha256, "source_sha256": self.source_sha256}}


def _spec_json(spec: KernelSpec) -> dict:
    return {"name": spec.name, "library": spec.library, "ops": list(spec.ops),
            "sources": list(spec.sources), "cuda_sources": list(spec.cuda_sources)}


def _read(folder: Path) -> tuple[Path, dict]:
    path = Path(folder) / KERNEL_JSON
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(path, None, "a kernel description (file not found)") from None
    except ValueError as err:
        raise ConfigError(path, None, f"valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(path, None, "a JSON object")
    return path, data


def _names(path: Path, data: dict, key: str, required: bool) -> tuple[str, ...]:
    value = data.get(key, [] if not required else None)
    if not isinstance(value, list) or (required and not value) or not all(
            isinstance(v, str) and v and "/" not in v and not v.startswith(".") for v in value):
        raise ConfigError(path, key, "a list of plain file or op names" + (" (at least one)" if required else ""))
    return tuple(value)


def load_spec(folder: Path | str) -> KernelSpec:
    path, data = _read(Path(folder))
    for key in ("name", "library"):
        if not isinstance(data.get(key), str) or not data[key].isidentifier():
            raise ConfigError(path, key, "an identifier")
    spec = KernelSpec(Path(folder), data["name"], data["library"], _names(path, data, "ops", True),
                      _names(path, data, "sources", True), _names(path, data, "cuda_sources", False))
    return spec


def load_kernel(folder: Path | str) -> Kernel:
    """A built kernel: kernel.json with its `build` section, next to the library it names."""
    spec = load_spec(folder)
    path, data = _read(Path(folder))
    build = data.get("build")
    if not isinstance(build, dict):
        raise ConfigError(path, "build", f"a build record (run: fleetspec kernels build {folder})")
    try:
        abi = Abi(str(build["python_tag"]), str(build["torch"]), str(build["cuda"]), bool(build["cxx11_abi"]),
                  str(build["platform"]), tuple(str(a) for a in build.get("arch_list", [])))
        kernel = Kernel(spec, abi, str(build["library_file"]), str(build["sha256"]), str(build["source_sha256"]))
    except KeyError as err:
        raise ConfigError(path, f"build.{err.args[0]}", "present") from None
    if "/" in kernel.library_file or not kernel.path.is_file():
        raise ConfigError(path, "build.library_file", f"a library file next to {KERNEL_JSON}")
    return kernel


def _fact(facts: Any, *names: str, default=None):
    for name in names:
        value = facts.get(name) if isinstance(facts, Mapping) else getattr(facts, name, None)
        if value is not None:
            return value
    return default


def host_abi(facts: Any) -> dict:
    """Normalise host facts (the torch fact's TorchInfo, or a dict) to the fields a kernel records."""
    return {
        "python_tag": _fact(facts, "python_tag"),
        "torch": _fact(facts, "torch", "version"),
        "cuda": _fact(facts, "cuda", default="cpu") or "cpu",
        "cxx11_abi": _fact(facts, "cxx11_abi"),
        "platform": _fact(facts, "platform"),
        "gpu_arch": tuple(_fact(facts, "gpu_arch", "device_capability", default=()) or ()),
    }


def check_abi(kernel: Kernel, host_facts: Any, host: str | None = None) -> None:
    """Refuse a kernel whose ABI tags differ from the host's, naming both values. A fact the host
    did not report (None) is not held against it, except torch: no torch, no kernel."""
    have = host_abi(host_facts)
    who = f"host {host}" if host else "the host"
    fix = f"build one with {build_command(host_facts)}"
    if not have["torch"]:
        raise UserError(f"kernel {kernel.name} needs torch {kernel.abi.torch}; {who} has no torch")
    checks = [("python", kernel.abi.python_tag, have["python_tag"]),
              ("torch", kernel.abi.torch, have["torch"]),
              ("CUDA", kernel.abi.cuda, have["cuda"]),
              ("C++11 ABI", kernel.abi.cxx11_abi, have["cxx11_abi"]),
              ("platform", kernel.abi.platform, have["platform"])]
    for label, built, found in checks:
        if found is not None and built != found:
            raise UserError(f"kernel {kernel.name} was built for {label} {built}; {who} has {label} {found}: {fix}")
    if kernel.abi.cuda != "cpu" and have["gpu_arch"]:
        built_for = {a.removesuffix("+PTX") for a in kernel.abi.arch_list}
        missing = [a for a in have["gpu_arch"] if str(a) not in built_for]
        if missing:
            raise UserError(f"kernel {kernel.name} was built for GPU arch {', '.join(kernel.abi.arch_list)}; "
                            f"{who} has {', '.join(map(str, missing))}: {fix}")


def cache_key(spec: KernelSpec, abi: Abi) -> str:
    """One folder per (sources, python, torch, CUDA or cpu, GPU arch list, C++ ABI)."""
    target = "cpu" if abi.cuda == "cpu" else "cu" + abi.cuda + "-sm" + "_".join(
        a.replace(".", "").replace("+PTX", "ptx") for a in abi.arch_list)
    return f"{spec.name}-{spec.source_sha256()[:16]}-{abi.python_tag}-torch{abi.torch}-{target}-abi{int(abi.cxx11_abi)}"


def cached_build(spec: KernelSpec, abi: Abi, cache: Path) -> Kernel | None:
    """The intact cached build of `spec` for exactly this ABI, or None."""
    try:
        kernel = load_kernel(Path(cache) / cache_key(spec, abi))
        kernel.file_bytes()
        return kernel
    except (ConfigError, OSError):
        return None


def record_build(spec: KernelSpec, abi: Abi, library: bytes, cache: Path) -> Kernel:
    """Put a library built for `abi` into the cache with its sources and kernel.json (staged
    beside the target, then renamed into place), wherever it was compiled."""
    folder = Path(cache) / cache_key(spec, abi)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as work:
        staging = Path(work) / "out"
        staging.mkdir()
        library_file = f"{spec.name}.so"
        (staging / library_file).write_bytes(library)
        for rel in spec.sources + spec.cuda_sources:
            shutil.copyfile(spec.root / rel, staging / rel)
        record = Kernel(KernelSpec(folder, spec.name, spec.library, spec.ops, spec.sources, spec.cuda_sources),
                        abi, library_file, hashlib.sha256(library).hexdigest(), spec.source_sha256())
        (staging / KERNEL_JSON).write_text(json.dumps(record.to_json(), indent=2) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return load_kernel(folder)


def describe_abi(facts: Any) -> str:
    """A host's ABI facts in one phrase, for messages."""
    have = host_abi(facts)
    arch = ", ".join(map(str, have["gpu_arch"])) or "none reported"
    return (f"python {have['python_tag']}, torch {have['torch']}, CUDA {have['cuda']}, "
            f"C++11 ABI {have['cxx11_abi']}, GPU arch {arch}")


def build_command(facts: Any) -> str:
    """The command that builds a kernel for a host with these facts."""
    have = host_abi(facts)
    if have["cuda"] == "cpu":
        return f"fleetspec kernels build (where python {have['python_tag']} has torch {have['torch']})"
    arch = ";".join(map(str, have["gpu_arch"])) or "<the GPUs' compute capability>"
    return (f"fleetspec kernels build --cuda --arch '{arch}' (where python {have['python_tag']} has torch "
            f"{have['torch']} and nvcc for CUDA {have['cuda']})")


def built_kernels(source: Path | str, cache: Path | None = None) -> list[Kernel]:
    """Every cached build of this source folder's current sources (any ABI), newest first."""
    cache = KERNEL_CACHE if cache is None else cache
    spec = load_spec(source)
    prefix = f"{spec.name}-{spec.source_sha256()[:16]}-"
    found = []
    for folder in sorted(Path(cache).glob(prefix + "*")) if Path(cache).is_dir() else []:
        try:
            found.append(load_kernel(folder))
        except (ConfigError, OSError):
            continue
    return sorted(found, key=lambda k: k.path.stat().st_mtime, reverse=True)


def find_built_kernel(source: Path | str, host_facts: Any, cache: Path | None = None,
                      host: str | None = None) -> Kernel:
    """The newest cached build of `source` whose ABI tags match the host's facts. A folder that is
    itself a build is taken as it is, and checked. None matching is refused, naming the host's
    facts, the builds there are, and the command that builds the missing one."""
    cache = KERNEL_CACHE if cache is None else cache
    try:
        kernel = load_kernel(source)
    except ConfigError:
        pass
    else:
        check_abi(kernel, host_facts, host=host)
        return kernel
    builds = built_kernels(source, cache)
    who = f"host {host}" if host else "the host"
    name = load_spec(source).name
    if not builds:
        raise UserError(f"kernel {name} ({source}) has no build for its current sources in {cache} "
                        f"({who} has {describe_abi(host_facts)}); run: {build_command(host_facts)}")
    reasons = []
    for kernel in builds:
        try:
            check_abi(kernel, host_facts, host=host)
            return kernel
        except UserError as err:
            reasons.append(str(err).split(": build one with")[0])
    if len(builds) == 1:       # the one build there is, and why it does not fit
        raise UserError(f"{reasons[0]}: build one with {build_command(host_facts)}")
    have = ", ".join(f"{k.abi.python_tag}/torch {k.abi.torch}/{'cpu' if k.abi.cuda == 'cpu' else 'CUDA ' + k.abi.cuda}"
                     f"{('/arch ' + ','.join(k.abi.arch_list)) if k.abi.arch_list else ''}" for k in builds)
    raise UserError(f"kernel {name}: none of its {len(builds)} builds ({have}) matches {who} "
                    f"({describe_abi(host_facts)}); build one with {build_command(host_facts)}")


# --- building (here, with this machine's torch) ---------------------------------------------


def local_abi(cuda_build: bool, arch: str | None = None) -> Abi:
    """The ABI tags of a build with this process's torch (arch: the TORCH_CUDA_ARCH_LIST built for)."""
    import sys
    import sysconfig

    import torch

    arch_list: tuple[str, ...] = ()
    if cuda_build:
        listed = arch or os.environ.get("TORCH_CUDA_ARCH_LIST")
        if listed:
            arch_list = tuple(a for a in listed.replace(";", " ").split() if a)
        else:
            major, minor = torch.cuda.get_device_capability()
            arch_list = (f"{major}.{minor}",)
    return Abi(python_tag="cp%d%d" % sys.version_info[:2], torch=torch.__version__,
               cuda=torch.version.cuda if cuda_build else "cpu",
               cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
               platform=sysconfig.get_platform().replace("-", "_").replace(".", "_"), arch_list=arch_list)


def _can_build_cuda(spec: KernelSpec, want: bool | None, arch: str | None) -> bool:
    """want None: CUDA where this machine can (a CUDA torch, nvcc, a GPU to read the arch from);
    True: CUDA or refuse, with no GPU needed when the arch list is given."""
    import torch
    from torch.utils import cpp_extension

    if want is False or not spec.cuda_sources:
        if want:
            raise UserError(f"kernel {spec.name} has no cuda_sources to build")
        return False
    missing = []
    if not torch.version.cuda:
        missing.append(f"this python's torch {torch.__version__} is a CPU build (a CUDA build of torch is needed "
                       f"for its CUDA headers and libraries)")
    if not cpp_extension.CUDA_HOME:
        missing.append("no CUDA toolkit found (set CUDA_HOME, or pip install nvidia-cuda-nvcc-cu12 and point "
                       "CUDA_HOME at it)")
    if not (arch or os.environ.get("TORCH_CUDA_ARCH_LIST")) and not (torch.version.cuda and torch.cuda.is_available()):
        missing.append("no GPU to read the arch from (give --arch, e.g. '9.0', from the hosts' nvidia-smi compute_cap)")
    if want and missing:
        raise UserError(f"cannot build kernel {spec.name} for CUDA here: " + "; ".join(missing))
    return not missing


_COMPILE = """
import json, sys
from torch.utils import cpp_extension
name, sources, work, verbose = json.loads(sys.argv[1])
cpp_extension.load(name=name, sources=sources, build_directory=work, extra_cflags=["-O3"],
                   extra_cuda_cflags=["-O3"], is_python_module=False, verbose=verbose)
"""


def _compile_in_child(name: str, sources: list[str], work: str, verbose: bool, arch: tuple[str, ...] = ()) -> None:
    """cpp_extension.load also loads the library; in this process a later load of the cached copy
    would register the ops twice and abort, so the compiler runs in a child."""
    import subprocess
    import sys

    env = dict(os.environ, **({"TORCH_CUDA_ARCH_LIST": ";".join(arch)} if arch else {}))
    done = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps([name, sources, work, verbose])],
                          capture_output=not verbose, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-5:] if not verbose else []
        raise UserError(f"compiling kernel {name} failed (exit {done.returncode})" + (": " + " | ".join(tail) if tail else ""))


def build_kernel(source: Path | str, cache: Path = KERNEL_CACHE, out: Path | None = None,
                 verbose: bool = False, cuda: bool | None = None, arch: str | None = None) -> tuple[Kernel, bool]:
    """Compile `source` with torch.utils.cpp_extension, cache it by source hash and ABI, and record
    kernel.json. cuda: None = CUDA too where this machine can, True = CUDA or refuse (no GPU
    needed with `arch`), False = CPU only. Returns (kernel, built_now)."""
    spec = load_spec(source)
    cuda = _can_build_cuda(spec, cuda, arch)
    abi = local_abi(cuda, arch)
    kernel, built_now = cached_build(spec, abi, cache), False
    if kernel is None:
        Path(cache).mkdir(parents=True, exist_ok=True)
        sources = [str(spec.root / s) for s in spec.sources + (spec.cuda_sources if cuda else ())]
        with tempfile.TemporaryDirectory(dir=cache) as work:
            _compile_in_child(f"{spec.library}_{spec.name}", sources, work, verbose, abi.arch_list)
            kernel = record_build(spec, abi, next(Path(work).glob("*.so")).read_bytes(), cache)
        built_now = True
    folder = kernel.spec.root
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        for name in (kernel.library_file, KERNEL_JSON, *spec.sources, *spec.cuda_sources):
            shutil.copyfile(folder / name, Path(out) / name)
        kernel = load_kernel(out)
    return kernel, built_now


# --- building for CUDA hosts on a machine without CUDA ---------------------------------------


def _wheel_torch(torch_root: Path) -> tuple[str, str, str]:
    """(torch version, CUDA version, python tag) of an unpacked torch wheel, read without importing it."""
    import re

    text = (torch_root / "torch/version.py").read_text()
    version = re.search(r"__version__\s*=\s*'([^']+)'", text)
    cuda = re.search(r"cuda(?::\s*Optional\[str\])?\s*=\s*'([^']+)'", text)
    if not version or not cuda:
        raise UserError(f"{torch_root}: torch/version.py names no version or no CUDA (not a CUDA build of torch)")
    tags = [line.split(":", 1)[1].strip() for p in torch_root.glob("torch-*.dist-info/WHEEL")
            for line in p.read_text().splitlines() if line.startswith("Tag:")]
    return version.group(1), cuda.group(1), (tags[0].split("-")[0] if tags else "")


def _uses_cxx11_abi(torch_root: Path) -> bool:
    """libc10.so exports std::__cxx11 symbols only when built with the C++11 ABI."""
    return b"__cxx11" in (torch_root / "torch/lib/libc10.so").read_bytes()


def build_kernel_offline(source: Path | str, torch_root: Path | str, cuda_home: Path | str, arch: str,
                         cache: Path = KERNEL_CACHE, verbose: bool = False) -> tuple[Kernel, bool]:
    """Compile `source` for CUDA hosts with nvcc from `cuda_home` against an unpacked CUDA build of
    torch (`torch_root`, never imported: no GPU, no CUDA runtime needed here), the flags
    torch.utils.cpp_extension uses, and record the ABI tags the hosts must match."""
    import subprocess
    import sysconfig

    spec = load_spec(source)
    torch_root, cuda_home = Path(torch_root), Path(cuda_home)
    nvcc = cuda_home / "bin/nvcc"
    if not nvcc.is_file():
        raise UserError(f"--cuda-home {cuda_home}: no bin/nvcc (scripts/cuda-toolchain.sh fetches one)")
    if not (torch_root / "torch/include").is_dir():
        raise UserError(f"--torch-root {torch_root}: no torch/include (an unpacked CUDA build of torch)")
    version, cuda, python_tag = _wheel_torch(torch_root)
    arch_list = tuple(a for a in arch.replace(";", " ").replace(",", " ").split() if a)
    if not arch_list or not all(a.removesuffix("+PTX").replace(".", "").isdigit() for a in arch_list):
        raise UserError(f"--arch {arch!r}: expected compute capabilities such as '9.0' or '8.0;9.0'")
    abi = Abi(python_tag=python_tag or "cp%d%d" % __import__("sys").version_info[:2], torch=version, cuda=cuda,
              cxx11_abi=_uses_cxx11_abi(torch_root),
              platform=sysconfig.get_platform().replace("-", "_").replace(".", "_"), arch_list=arch_list)
    cached = cached_build(spec, abi, cache)
    if cached is not None:
        return cached, False
    ext = torch_root / "torch/utils/cpp_extension.py"
    std = "-std=c++20" if ext.is_file() and "-std=c++20" in ext.read_text() else "-std=c++17"
    inc = torch_root / "torch/include"
    includes = [f"-I{inc}", f"-I{inc}/torch/csrc/api/include", f"-I{cuda_home}/include"]
    abi_flag = f"-D_GLIBCXX_USE_CXX11_ABI={int(abi.cxx11_abi)}"
    gencode = []
    for a in arch_list:
        cc = a.removesuffix("+PTX").replace(".", "")
        gencode.append(f"-gencode=arch=compute_{cc},code=sm_{cc}")
        if a.endswith("+PTX"):
            gencode.append(f"-gencode=arch=compute_{cc},code=compute_{cc}")
    Path(cache).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        w = Path(work)
        jobs = [[str(nvcc), "-c", str(spec.root / s), "-o", str(w / (s + ".o")), "-O3", std, abi_flag, *gencode,
                 "-Xcompiler", "-fPIC", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                 "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr",
                 *includes] for s in spec.cuda_sources]
        jobs += [["c++", "-c", str(spec.root / s), "-o", str(w / (s + ".o")), "-O3", "-fPIC", std, abi_flag,
                  *includes] for s in spec.sources]
        for job in jobs:
            done = subprocess.run(job, capture_output=not verbose, text=True)
            if done.returncode != 0:
                tail = (done.stderr or "").strip().splitlines()[-5:] if not verbose else []
                raise UserError(f"compiling {Path(job[2]).name} for CUDA {cuda} failed (exit {done.returncode})"
                                + (": " + " | ".join(tail) if tail else ""))
        lib = w / "out" / f"{spec.name}.so"
        lib.parent.mkdir()
        cudart = sorted((cuda_home / "lib").glob("libcudart.so*"))
        if not cudart:
            raise UserError(f"--cuda-home {cuda_home}: no lib/libcudart.so*")
        link = ["c++", "-shared", "-o", str(lib), *[str(w / (s + ".o")) for s in spec.sources + spec.cuda_sources],
                f"-L{torch_root}/torch/lib", "-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch",
                f"-L{cuda_home}/lib", f"-l:{cudart[0].name}"]
        done = subprocess.run(link, capture_output=not verbose, text=True)
        if done.returncode != 0:
            raise UserError(f"linking kernel {spec.name} failed: {(done.stderr or '').strip().splitlines()[-3:]}")
        return record_build(spec, abi, lib.read_bytes(), cache), True

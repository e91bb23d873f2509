"""Building kernels: with this machine's torch (`build_kernel`), for CUDA hosts on a machine
without CUDA against an unpacked CUDA torch (`build_kernel_offline`), and the one way any build,
wherever it was compiled (build.kernel_on_host builds on a fleet host), enters the cache
(`record_build`), keyed by source hash and ABI (fleetspec.model.kernel.cache_key)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from fleetspec.build import compile_flags as flags
from fleetspec.errors import ConfigError, UserError
from fleetspec.model.kernel import (
    KERNEL_CACHE,
    KERNEL_JSON,
    Abi,
    Kernel,
    KernelSpec,
    abi_problem,
    cache_key,
    load_kernel,
    load_spec,
)


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
    beside the target, then renamed into place), wherever it was compiled. Tags that could not
    name a build (a `/` or `..` would place, or remove, a folder outside the cache) are refused."""
    why = abi_problem(abi)
    if why:
        raise UserError(f"kernel {spec.name}: refusing to record a build whose ABI {why}")
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
            arch_list = tuple(flags.arch_list(listed))
        else:
            major, minor = torch.cuda.get_device_capability()
            arch_list = (f"{major}.{minor}",)
    cuda = torch.version.cuda if cuda_build else "cpu"
    if cuda is None:
        raise UserError(f"a CUDA kernel build needs a torch built with CUDA; {sys.executable} has torch "
                        f"{torch.__version__} without it")
    return Abi(python_tag="cp%d%d" % sys.version_info[:2], torch=torch.__version__, cuda=cuda,
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
name, sources, work, verbose, optimize = json.loads(sys.argv[1])
cpp_extension.load(name=name, sources=sources, build_directory=work, extra_cflags=optimize,
                   extra_cuda_cflags=optimize, is_python_module=False, verbose=verbose)
"""


def _compile_in_child(name: str, sources: list[str], work: str, verbose: bool, arch: tuple[str, ...] = ()) -> None:
    """cpp_extension.load also loads the library; in this process a later load of the cached copy
    would register the ops twice and abort, so the compiler runs in a child."""
    import subprocess
    import sys

    env = dict(os.environ, **({"TORCH_CUDA_ARCH_LIST": ";".join(arch)} if arch else {}))
    done = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps([name, sources, work, verbose, flags.OPTIMIZE])],
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
    import sysconfig

    spec = load_spec(source)
    torch_root, cuda_home = Path(torch_root), Path(cuda_home)
    if not (cuda_home / "bin/nvcc").is_file():
        raise UserError(f"--cuda-home {cuda_home}: no bin/nvcc (scripts/cuda-toolchain.sh fetches one)")
    if not (torch_root / "torch/include").is_dir():
        raise UserError(f"--torch-root {torch_root}: no torch/include (an unpacked CUDA build of torch)")
    version, cuda, python_tag = _wheel_torch(torch_root)
    arch_list = tuple(flags.arch_list(arch))
    if not arch_list or flags.bad_arch(list(arch_list)):
        raise UserError(f"--arch {arch!r}: expected compute capabilities such as '9.0' or '8.0;9.0'")
    abi = Abi(python_tag=python_tag or "cp%d%d" % __import__("sys").version_info[:2], torch=version, cuda=cuda,
              cxx11_abi=_uses_cxx11_abi(torch_root),
              platform=sysconfig.get_platform().replace("-", "_").replace(".", "_"), arch_list=arch_list)
    cached = cached_build(spec, abi, cache)
    if cached is not None:
        return cached, False
    Path(cache).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        lib = _nvcc_build(spec, abi, torch_root, cuda_home, Path(work), verbose)
        return record_build(spec, abi, lib.read_bytes(), cache), True


def _nvcc_build(spec: KernelSpec, abi: Abi, torch_root: Path, cuda_home: Path, w: Path, verbose: bool) -> Path:
    """Compile and link in `w` with nvcc and c++ (compile_flags: cpp_extension's flags); the library's path."""
    import subprocess

    ext = torch_root / "torch/utils/cpp_extension.py"
    inc = torch_root / "torch/include"
    data = {"library": spec.library, "sources": list(spec.sources), "cuda_sources": list(spec.cuda_sources)}
    jobs = flags.compile_jobs(data, str(spec.root), str(w), cxx="c++", nvcc=str(cuda_home / "bin/nvcc"),
                              std=flags.cxx_std(ext.read_text() if ext.is_file() else ""), cxx11_abi=abi.cxx11_abi,
                              includes=[str(inc), f"{inc}/torch/csrc/api/include", f"{cuda_home}/include"],
                              archs=list(abi.arch_list))
    for job in jobs:
        done = subprocess.run(job, capture_output=not verbose, text=True)
        if done.returncode != 0:
            tail = (done.stderr or "").strip().splitlines()[-5:] if not verbose else []
            raise UserError(f"compiling {Path(job[2]).name} for CUDA {abi.cuda} failed (exit {done.returncode})"
                            + (": " + " | ".join(tail) if tail else ""))
    lib = w / "out" / f"{spec.name}.so"
    lib.parent.mkdir()
    cudart = sorted((cuda_home / "lib").glob("libcudart.so*"))
    if not cudart:
        raise UserError(f"--cuda-home {cuda_home}: no lib/libcudart.so*")
    link = flags.link_command(data, str(w), str(lib), cxx="c++", library_dirs=[f"{torch_root}/torch/lib",
                              f"{cuda_home}/lib"], cuda=True, cudart=f"-l:{cudart[0].name}")
    done = subprocess.run(link, capture_output=not verbose, text=True)
    if done.returncode != 0:
        raise UserError(f"linking kernel {spec.name} failed: {(done.stderr or '').strip().splitlines()[-3:]}")
    return lib

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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from fleetspec.errors import ConfigError, UserError
from fleetspec.model.cache import cache_dir

KERNEL_JSON = "kernel.json"
KERNEL_CACHE = cache_dir() / "kernels"


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

    def to_json(self) -> dict[str, Any]:
        return {**_spec_json(self.spec), "build": {
            "python_tag": self.abi.python_tag, "torch": self.abi.torch, "cuda": self.abi.cuda,
            "cxx11_abi": self.abi.cxx11_abi, "platform": self.abi.platform,
            "arch_list": list(self.abi.arch_list), "library_file": self.library_file,
            "sha256": self.sha256, "source_sha256": self.source_sha256}}


def _spec_json(spec: KernelSpec) -> dict[str, Any]:
    return {"name": spec.name, "library": spec.library, "ops": list(spec.ops),
            "sources": list(spec.sources), "cuda_sources": list(spec.cuda_sources)}


def _read(folder: Path) -> tuple[Path, dict[str, Any]]:
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


def _names(path: Path, data: dict[str, Any], key: str, required: bool) -> tuple[str, ...]:
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


def _fact(facts: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = facts.get(name) if isinstance(facts, Mapping) else getattr(facts, name, None)
        if value is not None:
            return value
    return default


def host_abi(facts: Any) -> dict[str, Any]:
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


# What each ABI tag may be: it becomes part of a cache folder's name (a host reports it when it
# builds, `kernels build --on`), so no `/`, no `..`, nothing but what real tags hold.
ABI_FIELDS = {
    "python_tag": re.compile(r"cp3\d{1,2}"),
    "torch": re.compile(r"\d+\.\d+(\.?[A-Za-z0-9]+)*(\+[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*)?"),
    "cuda": re.compile(r"cpu|\d{1,3}\.\d{1,3}(\.\d{1,3})?"),
    "platform": re.compile(r"[a-z0-9_]{1,64}"),
    "arch": re.compile(r"\d{1,3}\.\d{1,3}[a-z]?(\+PTX)?"),
}


def abi_problem(abi: Abi) -> str | None:
    """Why these tags cannot name a build (None when they can)."""
    for field in ("python_tag", "torch", "cuda", "platform"):
        value = getattr(abi, field)
        if not isinstance(value, str) or not ABI_FIELDS[field].fullmatch(value):
            return f"{field} {value!r} is not a {field} tag"
    if not isinstance(abi.cxx11_abi, bool):
        return f"cxx11_abi {abi.cxx11_abi!r} is not true or false"
    if not isinstance(abi.arch_list, tuple) or len(abi.arch_list) > 32 or not all(
            isinstance(a, str) and ABI_FIELDS["arch"].fullmatch(a) for a in abi.arch_list):
        return f"arch_list {list(abi.arch_list)!r} is not a list of GPU arch tags (e.g. 9.0, 8.6+PTX)"
    if (abi.cuda == "cpu") != (not abi.arch_list):
        return f"cuda {abi.cuda!r} with arch_list {list(abi.arch_list)!r}: a CPU build has no arch, a CUDA build some"
    return None


def cache_key(spec: KernelSpec, abi: Abi) -> str:
    """One folder per (sources, python, torch, CUDA or cpu, GPU arch list, C++ ABI)."""
    target = "cpu" if abi.cuda == "cpu" else "cu" + abi.cuda + "-sm" + "_".join(
        a.replace(".", "").replace("+PTX", "ptx") for a in abi.arch_list)
    return f"{spec.name}-{spec.source_sha256()[:16]}-{abi.python_tag}-torch{abi.torch}-{target}-abi{int(abi.cxx11_abi)}"


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


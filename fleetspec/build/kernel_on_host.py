"""`fleetspec kernels build --on HOST`: compile a kernel folder on a fleet host, with that host's
own python, torch and compiler (nvcc too for a CUDA torch), and fetch the library back into the
local kernel cache, keyed by the ABI that host really has, so that a deploy to any host with the
same facts picks it. The build runs in a scratch folder inside the root-only run folder, which is
removed whatever happens; nothing else on the host changes."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fleetspec.build import compile_flags
from fleetspec.build import kernel as KB
from fleetspec.errors import UserError
from fleetspec.model import hostjson
from fleetspec.model import kernel as K
from fleetspec.remote import facts, files
from fleetspec.remote.facts import gpu as gpu_fact
from fleetspec.remote.facts import torch as torch_fact
from fleetspec.remote.kernel_build_host import REMOTE_BUILD


def program() -> str:
    """The on-host build: compile_flags' functions, then the program that calls them."""
    return Path(compile_flags.__file__).read_text() + REMOTE_BUILD


def _target_arch(host: str, tv, gpus, cuda: bool | None, arch: str | None, spec: K.KernelSpec) -> str:
    """The arch list a build on this host compiles for: "" for a CPU build. A CUDA build (the
    host's torch is a CUDA build; --cuda asks for one) takes --arch, else the GPUs' compute_cap."""
    if cuda is False or not spec.cuda_sources or (cuda is None and not tv.cuda):
        if cuda:
            raise UserError(f"kernels build --on {host}: kernel {spec.name} has no cuda_sources")
        return ""
    if not tv.cuda:
        raise UserError(f"kernels build --on {host}: its torch {tv.version} is a CPU build; a CUDA build needs a CUDA torch")
    caps = sorted({g.compute_cap for g in (gpus.gpus if gpus and gpus.present else []) if g.compute_cap})
    listed = arch or ";".join(caps)
    if not listed:
        raise UserError(f"kernels build --on {host}: no GPU arch (nvidia-smi reports no compute_cap); give --arch")
    return listed


def reported_abi(host: str, result: dict, tv, target: str, library: str) -> K.Abi:
    """The ABI the build reported, refused unless every tag is one (they name the cache folder)
    and all agree with the torch facts read from the same host: a report that differs would
    publish its library under another ABI, for every host that has that one."""
    where = f"kernels build --on {host}"
    raw = result.get("abi")
    if not isinstance(raw, dict) or result.get("library") != library:
        raise UserError(f"{where}: the build report is not a library in its scratch folder and an ABI")
    try:
        abi = K.Abi(raw["python_tag"], raw["torch"], raw["cuda"], raw["cxx11_abi"], raw["platform"],
                    tuple(raw["arch_list"]))
    except (KeyError, TypeError):
        raise UserError(f"{where}: the build report's ABI lacks a tag ({sorted(raw)[:8]})") from None
    why = K.abi_problem(abi)
    if why:
        raise UserError(f"{where}: the build reported an ABI whose {why}")
    archs = tuple(a for a in target.replace(";", " ").split() if a)
    facts_say = {"python_tag": tv.python_tag, "torch": tv.version, "cuda": tv.cuda if archs else "cpu",
                 "cxx11_abi": tv.cxx11_abi, "arch_list": archs}
    for field, want in facts_say.items():
        got = getattr(abi, field)
        if got != want:
            raise UserError(f"{where}: the build reported {field} {got!r}, but the host's torch facts say "
                            f"{want!r}; refusing to record it under another ABI")
    return abi


def build_on_host(t, host, source: Path | str, cache: Path = K.KERNEL_CACHE, *, cuda: bool | None = None,
                  arch: str | None = None, timeout: float = 900) -> tuple[K.Kernel, bool]:
    """Build `source` on `host` (transport `t`) and record it in `cache`; (kernel, built_now)."""
    spec = K.load_spec(source)
    python = host.vars.python
    found = facts.gather_many(t, [(torch_fact, {"python": python, "keep": True}), (gpu_fact, {})], errors="return")
    tv, gpus = found
    if isinstance(tv, Exception) or not tv.installed:
        why = tv if isinstance(tv, Exception) else (tv.error or "not importable")
        raise UserError(f"kernels build --on {host.name}: no torch in {python} ({why})")
    gpus = None if isinstance(gpus, Exception) else gpus
    target = _target_arch(host.name, tv, gpus, cuda, arch, spec)
    scratch = files.make_scratch(t)
    try:
        for name in (K.KERNEL_JSON, *spec.sources, *spec.cuda_sources):
            t.put_bytes((spec.root / name).read_bytes(), f"{scratch}/{name}", mode=0o600, durable=False)
        r = files.run_python(t, python, program(), [scratch, target], timeout=timeout)
        try:
            result = hostjson.loads_object(r.stdout.strip().splitlines()[-1], "the build report")
        except (ValueError, IndexError):
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.rc}, no output"]
            raise UserError(f"kernels build --on {host.name}: the build did not report ({tail[0]})") from None
        if "error" in result:
            raise UserError(f"kernels build --on {host.name}: {str(result['error'])[:400]}")
        abi = reported_abi(host.name, result, tv, target, f"{scratch}/{spec.name}.so")
        library = t.get_bytes(f"{scratch}/{spec.name}.so")
    finally:
        files.rm_tree(t, scratch, timeout=60, check=False)
    cached = KB.cached_build(spec, abi, cache)
    if cached is not None and cached.sha256 == hashlib.sha256(library).hexdigest():
        return cached, False
    return KB.record_build(spec, abi, library, cache), True

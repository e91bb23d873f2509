"""What a deploy ships to one host: the patch set for its sglang version (its base files checked
against what is installed) and, for each kernel folder, the build matching the host's ABI."""

from __future__ import annotations

import os
import threading
from typing import Any

from fleetspec.errors import UserError
from fleetspec.ops.preflight_checks import check_contents
from fleetspec.remote import files
from fleetspec.remote.api import TransportLike


def preload_patchsets(playbook) -> dict:
    """Each version's patch set loaded (or the error loading it raised, raised again only if that
    version is picked): their paths ride in preflight's batch before the host's version is known."""
    out: dict = {}
    for version, folder in (getattr(playbook, "patchsets", None) or {}).items():
        try:
            out[version] = load_patchset_once(folder)
        except Exception as err:  # kept and raised where today's load raises it
            out[version] = err
    return out


_LOADED: dict[str, tuple[tuple, object]] = {}


_LOADING = threading.Lock()


def _folder_stamp(folder) -> tuple:
    """Every file under a patch set folder with its size and mtime: an edit makes a new stamp."""
    out = []
    for dirpath, _, names in os.walk(str(folder)):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            out.append((dirpath, name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def load_patchset_once(folder):
    """load_patchset, once per process while the folder's files stay as they were: a deploy to N
    hosts loads (a patches folder: builds) each version's patch set once, not once per host.
    The hosts' threads start together, so the load is serialised: one thread loads (hashing the
    sglang wheel for the build cache's key), the others wait for it and take its result.
    Failures are not kept: the next host loads again and gets the error again."""
    from fleetspec.build.patchset import load_patchset

    with _LOADING:
        stamp = _folder_stamp(folder)
        kept = _LOADED.get(str(folder))
        if kept is not None and kept[0] == stamp:
            return kept[1]
        patchset = load_patchset(folder)
        _LOADED[str(folder)] = (stamp, patchset)
        return patchset


def candidate_paths(loaded: dict) -> tuple[str, ...]:
    """Every file path of the loaded patch sets (few files each), for the sglang fact to hash."""
    return tuple(sorted({f.path for ps in loaded.values() if not isinstance(ps, Exception) for f in ps.files}))


def select_patchset(t: TransportLike, playbook, sg, host: str, loaded: dict | None = None):
    if not playbook.patchsets:
        return None
    from fleetspec.model.patchset import check_base
    from fleetspec.model.patchset import select_patchset as pick

    folder = pick(playbook.patchsets, sg.version, host=host)
    patchset = (loaded or {}).get(sg.version)
    if isinstance(patchset, Exception):
        raise patchset
    patchset = patchset or load_patchset_once(folder)
    check_contents(patchset)
    try:
        check_base(patchset, sg.version, _installed(t, sg, patchset))
    except UserError as err:
        raise UserError(f"{host}: {err}") from None
    return patchset


def _installed(t: TransportLike, sg, patchset) -> dict[str, str]:
    """The patch set's installed sha256s: from the sglang fact when the batch hashed every one of
    its paths, else read now (installed_hashes)."""
    got = getattr(sg, "hashes", None)
    wanted = [f.path for f in patchset.files]
    if got is None or any(p not in got for p in wanted):
        return installed_hashes(t, sg.site_packages, patchset)
    return {p: got[p] for p in wanted if got[p] is not None}


def installed_hashes(t: TransportLike, site_packages: str, patchset) -> dict[str, str]:
    """sha256 of each of the patch set's paths as installed on the host (absent ones omitted)."""
    paths = {f"{site_packages}/{f.path}": f.path for f in patchset.files}
    got = files.sha256_map(t, paths)
    return {paths[p]: digest for p, digest in got.items() if p in paths}


def load_kernels(playbook, torch_facts, host: str) -> list:
    """For each kernel folder, the build matching the host's ABI facts (torch, python, CUDA or cpu,
    C++ ABI, GPU arch); none matching is refused whatever the kernel_policy, naming both sides and
    the command that builds it. The policy decides what a library that then does not load means:
    required fails the smoke tests, optional falls back to torch with a note."""
    if not playbook.kernels:
        return []
    from fleetspec.errors import ConfigError
    from fleetspec.model.kernel import KERNEL_JSON, find_built_kernel
    from fleetspec.model.patchset import sha256_file

    out = []
    for folder in playbook.kernels:
        kernel = find_built_kernel(folder, torch_facts, host=host)
        if sha256_file(kernel.path) != kernel.sha256:     # here, not half-way through staging
            raise ConfigError(kernel.spec.root / KERNEL_JSON, "build.sha256",
                              f"the sha256 of {kernel.library_file} (it changed since the build)")
        out.append(kernel)
    return out


def kernel_facts(torch_facts, gpus) -> dict:
    """The ABI facts a kernel build must match: the torch fact's, plus the GPUs' compute
    capabilities from nvidia-smi (a CUDA build must carry code for each)."""
    from fleetspec.model.kernel import host_abi

    facts: dict[str, Any] = host_abi(torch_facts) if torch_facts is not None else {"torch": None}
    caps = sorted({g.compute_cap for g in getattr(gpus, "gpus", []) or [] if getattr(g, "compute_cap", None)})
    if caps:
        facts["gpu_arch"] = tuple(caps)
    return facts

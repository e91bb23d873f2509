"""`python -m fleetspec.lab.prepare`: fill the caches that tests and the lab need, once.

The sglang wheel cache, the lab image (Debian rootfs, base, one layer per sglang version), both
versions' environments on this machine (tests run the real parsers), the kernels and the patch
sets (generated from their diffs and the wheels); unless FLEETSPEC_LAB_CONTAINERS=0 also the
container hosts' podman layer, Quadlet layer and image. Every piece is keyed by its recipe, so a warm
machine does nothing here and prints nothing; a cold one prints one line per stage with its seconds.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from fleetspec.errors import UserError
from fleetspec.lab import envs, image, podman_image, quadlet

ROOT = Path(__file__).resolve().parents[2]


def _quiet(_line: str) -> None:
    pass


Lane = list[tuple[str, Callable[[], bool]]]


def stages() -> list[Lane]:
    """Lanes of (name, step); a lane's steps run in order, the lanes side by side (after the
    first, which the others need). Each step returns True when it did work (a cold stage)."""
    first: Lane = [
        ("download", lambda: envs.download_wheels() > 0),
        ("patch sets", build_patchsets),
    ]
    first_version, *later_versions = envs.SGLANG_VERSIONS
    image_lane: Lane = [
        ("rootfs", lambda: image.ensure_rootfs(_quiet)),
        ("base image", _base_then_open),
        ("package layer", lambda: image.ensure_packages(_quiet)),
        (f"layer sglang {first_version}", functools.partial(image.ensure_layer, first_version, _quiet)),
    ]
    # The other versions' layers need only the base image: each is a lane of its own that waits
    # for it, so the layers' pip installs (the longest part of a cold set-up) overlap.
    layer_lanes: list[Lane] = [[("base image (waited for)", _wait_for_base),
                                (f"layer sglang {v}", functools.partial(image.ensure_layer, v, _quiet))]
                               for v in later_versions]
    if containers_wanted():
        # the container hosts' (pd<N>, pq<N>): podman's layer, Quadlet's generator, then the engine's
        # image imported from the version's layer (minutes, cold), after that layer in its lane
        lane = next(ln for ln in [image_lane, *layer_lanes] if ln[-1][0] == f"layer sglang {podman_image.CONTAINER_VERSIONS[0]}")
        lane.append(("podman layer", lambda: podman_image.ensure_podman(_quiet)))
        lane.append(("Quadlet layer", lambda: quadlet.ensure(_quiet)))
        for version in podman_image.CONTAINER_VERSIONS:
            lane.append((f"image sglang {version}", functools.partial(podman_image.ensure_image, version, _quiet)))
    local_lane: Lane = [
        (f"local env sglang {version}", functools.partial(envs.local_env_built, version)) for version in envs.SGLANG_VERSIONS]
    kernel_lane: Lane = [("kernels", build_kernels)]
    if os.environ.get("FLEETSPEC_CUDA_BUILD") == "1":
        kernel_lane.append(("cuda kernels", build_cuda_kernels))
    return [first, image_lane, *layer_lanes, local_lane, kernel_lane]


def containers_wanted() -> bool:
    """The container hosts' podman layer, Quadlet layer and image (minutes cold: a 2.8 GB import)
    are built unless FLEETSPEC_LAB_CONTAINERS=0 (their lab tests are skipped then too)."""
    return os.environ.get("FLEETSPEC_LAB_CONTAINERS", "1") != "0"


_BASE_DONE = threading.Event()


def _base_then_open() -> bool:
    try:
        return image.ensure_base(_quiet)
    finally:
        _BASE_DONE.set()


def _wait_for_base() -> bool:
    """Blocks until the image lane has tried the base image; fails if it is not there."""
    _BASE_DONE.wait()
    if not image.marker(image.base_dir()).exists():
        raise UserError("the base image was not built (see the image lane's failure)")
    return False


def _run_lane(lane: Lane) -> tuple[bool, str | None]:
    """(did any work, the first failure's line or None); stops at the first failure."""
    cold = False
    for name, step in lane:
        t0 = time.monotonic()
        try:
            did = step()
        except (envs.DownloadFailed, UserError) as err:
            return cold, f"prepare: {name} failed: {err}"
        if did:
            cold = True
            print(f"prepare: {name} {time.monotonic() - t0:.1f}s", flush=True)
    return cold, None


def _run_lane_then_release(lane: Lane) -> tuple[bool, str | None]:
    """_run_lane; the lane that builds the base image releases its waiters however it ends (a
    rootfs failure too), so no lane waits for ever."""
    try:
        return _run_lane(lane)
    finally:
        if any(step is _base_then_open for _, step in lane):
            _BASE_DONE.set()


def main() -> int:
    """The first lane, then the image and the local environments side by side: the two are
    independent (a chroot's pip and this machine's pip, each in folders of its own) and each is
    mostly one process, so on a cold machine they share its cores instead of taking turns."""
    started = time.monotonic()
    _BASE_DONE.clear()
    first, *rest = stages()
    cold, failed = _run_lane(first)
    if failed is None:
        with ThreadPoolExecutor(max_workers=len(rest)) as pool:
            results = list(pool.map(_run_lane_then_release, rest))
        cold = cold or any(did for did, _ in results)
        failed = next((why for _, why in results if why is not None), None)
    if failed is not None:
        print(failed, file=sys.stderr, flush=True)
        return 2
    if cold:
        print(f"prepare: cold set-up of {envs.CACHE} took {time.monotonic() - started:.0f}s", flush=True)
    return 0


def build_kernels() -> bool:
    """The DDTree kernels for this machine's torch (what deploy pushes to hosts with the same ABI)."""
    from fleetspec.build.kernel import build_kernel

    built_any = False
    for source in sorted((ROOT / "playbooks").glob("*/kernels/*/kernel.json")):
        _kernel, built = build_kernel(source.parent)
        built_any = built_any or built
    return built_any


def build_cuda_kernels() -> bool:
    """With FLEETSPEC_CUDA_BUILD=1: fetch the CUDA toolchain (scripts/cuda-toolchain.sh, cached) and
    compile every kernel's CUDA source with the real nvcc against a CUDA torch's headers, for the
    arch list in FLEETSPEC_CUDA_ARCH (default 9.0); cached like the CPU builds."""
    from fleetspec.build.kernel import build_kernel_offline
    from fleetspec.model.kernel import load_spec

    done = subprocess.run(["bash", str(ROOT / "scripts/cuda-toolchain.sh")], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise UserError(f"scripts/cuda-toolchain.sh failed: {last[0]}")
    paths = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    built_any = False
    for source in sorted((ROOT / "playbooks").glob("*/kernels/*/kernel.json")):
        if load_spec(source.parent).cuda_sources:
            _kernel, built = build_kernel_offline(source.parent, paths["torch_root"], paths["cuda_home"],
                                                  os.environ.get("FLEETSPEC_CUDA_ARCH", "9.0"))
            built_any = built_any or built
    return built_any


def build_patchsets() -> bool:
    """Every playbook's patch sets, generated from their diffs and the cached wheels."""
    from fleetspec.build import patchset as patchset_build

    built = [patchset_build.build(folder).built for folder in patchset_build.patches_folders(ROOT)]
    return any(built)


if __name__ == "__main__":
    sys.exit(main())

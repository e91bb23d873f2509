"""`python -m fleetspec.lab.prepare`: fill the caches that tests and the lab need, once.

The sglang wheel cache, both versions' environments on this machine (tests run the real parsers),
and the lab image. Every piece is keyed by its recipe, so a warm machine does nothing here.
"""

from __future__ import annotations

import sys
import time

from fleetspec.lab import envs, image


def main() -> int:
    started = time.monotonic()
    envs.download_wheels()
    for version in envs.SGLANG_VERSIONS:
        envs.local_env(version)
    image.ensure(envs.SGLANG_VERSIONS, log=lambda line: print(f"lab image: {line}", flush=True))
    build_kernels()
    print(f"prepare: caches ready under {envs.CACHE} in {time.monotonic() - started:.0f}s", flush=True)
    return 0


def build_kernels() -> None:
    """The DDTree kernels for this machine's torch (what deploy pushes to hosts with the same ABI)."""
    from pathlib import Path

    from fleetspec.model.kernel import build_kernel

    for source in sorted((Path(__file__).resolve().parents[2] / "playbooks").glob("*/kernels/*/kernel.json")):
        kernel, built = build_kernel(source.parent)
        print(f"kernel {kernel.name}: {'built' if built else 'cached'} for torch {kernel.abi.torch}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

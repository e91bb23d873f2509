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
    print(f"prepare: caches ready under {envs.CACHE} in {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

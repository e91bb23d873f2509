"""This machine's cache folder: `$FLEETSPEC_CACHE`, else /var/cache/fleetspec.

Wheels, lab environments and image layers, kernels and patch sets are kept below it; every module
that names one of those folders starts from `cache_dir()`, so the default is written once.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT = "/var/cache/fleetspec"


def cache_dir() -> Path:
    """The cache folder as the environment names it now."""
    return Path(os.environ.get("FLEETSPEC_CACHE", DEFAULT))

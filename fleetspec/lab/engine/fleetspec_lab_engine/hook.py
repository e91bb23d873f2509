"""The meta-path finder that redirects `sglang.launch_server` (and the `sglang` console script's
`sglang.cli.main`, for `sglang serve` units) to the stand-in; no other module."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

TARGET = "sglang.launch_server"
SHIM = Path(__file__).with_name("launch_server.py")
SHIMS = {TARGET: SHIM, "sglang.cli.main": Path(__file__).with_name("cli_main.py")}


class _Redirect:
    """Asked before the path finders, so it wins over any sglang copy on sys.path."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname not in SHIMS:
            return None
        return importlib.util.spec_from_file_location(fullname, SHIMS[fullname])


def install() -> None:
    if os.environ.get("FLEETSPEC_LAB_ENGINE", "on") == "off":
        return
    if not any(isinstance(f, _Redirect) for f in sys.meta_path):
        sys.meta_path.insert(0, _Redirect())

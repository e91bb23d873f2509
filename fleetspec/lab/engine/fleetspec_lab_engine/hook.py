"""The meta-path finder that redirects `sglang.launch_server` (and the `sglang` console script's
`sglang.cli.main`, for `sglang serve` units) to the stand-in; no other module.

With FLEETSPEC_LAB_ENGINE=thin (set only in a thin lab host's unit, so ssh sessions, smoke tests
and facts still see the real sglang) `sglang` itself becomes an empty package and
`sglang.launch_server` runs thin.py: nothing of sglang is imported."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

TARGET = "sglang.launch_server"
SHIM = Path(__file__).with_name("launch_server.py")
SHIMS = {TARGET: SHIM, "sglang.cli.main": Path(__file__).with_name("cli_main.py")}
THIN = {TARGET: Path(__file__).with_name("thin.py"), "sglang": Path(__file__).with_name("thin_package.py")}


class _Redirect:
    """Asked before the path finders, so it wins over any sglang copy on sys.path."""

    def __init__(self, shims: dict[str, Path]):
        self.shims = shims

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.shims:
            return None
        package = [] if fullname == "sglang" else None
        return importlib.util.spec_from_file_location(fullname, self.shims[fullname],
                                                      submodule_search_locations=package)


def install() -> None:
    mode = os.environ.get("FLEETSPEC_LAB_ENGINE", "on")
    if mode == "off":
        return
    if not any(isinstance(f, _Redirect) for f in sys.meta_path):
        sys.meta_path.insert(0, _Redirect(THIN if mode == "thin" else SHIMS))

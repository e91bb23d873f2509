"""The list of command groups; each lives in a module of its own under fleetspec/cli/."""

from __future__ import annotations

import importlib

_MODULES = ["status", "lab", "patchset", "kernels", "deploy", "rollback", "history", "bench"]


def _load():
    found = []
    for name in _MODULES:
        try:
            module = importlib.import_module(f"fleetspec.cli.{name}_cmd")
        except ModuleNotFoundError as err:
            if err.name == f"fleetspec.cli.{name}_cmd":
                continue
            raise
        found.extend(module.COMMANDS)
    return found


ALL = _load()

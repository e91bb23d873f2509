"""The command modules; each exports COMMANDS, a list of click commands or groups.

They are imported when a command is used (or all of them for `--help`): a deploy does not pay for
the patch set, kernel and bench commands' imports. MODULES names each top-level command's module
(tests/unit/test_cli_help.py checks it against every module's COMMANDS).
"""

from __future__ import annotations

import importlib

MODULES = {
    "status": "status_cmd",
    "deploy": "deploy_cmd", "rollback": "deploy_cmd", "unlock": "deploy_cmd", "baseline": "deploy_cmd",
    "history": "history_cmd",
    "rollouts": "rollouts_cmd", "promote": "rollouts_cmd", "abort": "rollouts_cmd",
    "inventory": "inventory_cmd",
    "bench": "bench_cmd",
    "patchset": "patchset_cmd",
    "kernels": "kernels_cmd",
    "lab": "lab_cmd",
    "gate": "gate_cmd", "render": "render_cmd",
}


def load(name: str) -> list:
    """The COMMANDS of the module that defines `name` (empty for an unknown name)."""
    module = MODULES.get(name)
    return importlib.import_module(f"fleetspec.cli.{module}").COMMANDS if module else []

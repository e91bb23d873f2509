"""One example line in every command's --help, a line for every option, and the lab's fault
kinds listed from the code.

Kept in one table so a command module stays as its owner wrote it; a command that says
`Example:` in its own docstring keeps its own. tests/unit/test_cli_help.py walks every command.
"""

from __future__ import annotations

import inspect
import types

import click

EXAMPLES = {
    "status": "fleetspec status @gpu --watch --deadline 900",
    "bench": "fleetspec bench ct129 --algo nextn --algo ddtree:budget=32 --concurrency 1 --concurrency 4",
    "patchset": "fleetspec patchset verify playbooks/ddtree/patches/sglang-0.5.23",
    "patchset build": "fleetspec patchset build --version 0.5.13.post1",
    "patchset verify": "fleetspec patchset verify playbooks/ddtree/patches/sglang-0.5.23",
    "patchset show": "fleetspec patchset show playbooks/ddtree/patches/sglang-0.5.23 --json",
    "kernels": "fleetspec kernels list",
    "kernels build": "fleetspec kernels build playbooks/ddtree/kernels/tree_mask",
    "kernels list": "fleetspec kernels list --json",
    "lab": "fleetspec lab up --hosts ct129,ct200",
    "lab up": "fleetspec lab up --hosts ct129,ct200",
    "lab down": "fleetspec lab down",
    "lab status": "fleetspec lab status --json",
    "lab fault": "fleetspec lab fault ct200 slow_load=60 only_algorithm=DDTREE",
    "inventory": "fleetspec -i hosts.ini inventory show",
}

# Help for options their command left without one (command path, option name) -> text.
OPTION_HELP = {
    ("deploy", "mode"): "release: a new overlay on PYTHONPATH, the venv untouched; in-place: replace files in "
                        "site-packages after backing them up.",
    ("bench", "concurrency"): "Concurrent requests per measurement; repeat for several levels.",
    ("bench", "requests"): "Requests per concurrency level.",
    ("bench", "max_new_tokens"): "Tokens generated per request.",
    ("bench", "as_json"): "One JSON object per algo.",
    ("kernels list", "cache"): "Kernel cache folder to look in.",
    ("kernels list", "as_json"): "Print JSON.",
}

# What each `lab fault` kind does; a kind missing here is still listed (from faults.KINDS).
FAULT_HELP = {
    "crash_at_start": "the engine exits at start (the unit fails or restarts)",
    "hang_at_start": "the engine never opens its port",
    "slow_load": "=S: the model load takes S seconds (status says loading meanwhile)",
    "health_503_after": "=S: /health answers 503 once S seconds have passed",
    "wrong_algorithm": "=NAME: /server_info reports NAME as the speculative algorithm",
    "garbage_output": "/generate returns tokens unrelated to the prompt",
    "slow_tokens": "=F: generation runs F times slower (F >= 1)",
    "disk_full": "writes under /var/lib/fleetspec fail with ENOSPC",
    "fail_requests_after": "=N: /generate answers 500 once the engine has served N requests (a release that "
                           "degrades after commit; /health stays 200)",
    "only_algorithm": "=NAME: a modifier: the other faults bite only an engine serving NAME",
}


def _path(ctx_names: list[str]) -> str:
    return " ".join(ctx_names)


def _fault_help(cmd) -> str:
    from fleetspec.lab.faults import KINDS

    lines = [inspect.cleandoc(cmd.help or "").split("\n\n")[0].rstrip(), "", "\b", "Fault kinds (KIND or KIND=VALUE):"]
    for kind, typ in KINDS.items():
        text = FAULT_HELP.get(kind, "(no description)")
        if typ is not None and not text.startswith("="):
            text = "=VALUE: " + text
        lines.append(f"  {kind}{text}" if text.startswith("=") else f"  {kind}: {text}")
    return "\n".join(lines)


def install(group: click.Group, prefix: str = "") -> None:
    """Add `Example: …` to each command's help (recursively); list fault kinds under `lab fault`."""
    for name, cmd in group.commands.items():
        install_command(cmd, f"{prefix}{name}")


def install_command(cmd: click.Command, path: str | None = None) -> None:
    """install() for one command (and its subcommands) at `path` (default: its own name)."""
    path = path or cmd.name or ""
    example = EXAMPLES.get(path)
    if example and "Example:" not in (cmd.help or ""):
        cmd.help = inspect.cleandoc(cmd.help or "").rstrip() + f"\n\n\b\nExample: {example}"
    if path == "lab fault":
        _lazy_fault_help(cmd, example)
    for param in cmd.params:
        text = OPTION_HELP.get((path, param.name))
        if isinstance(param, click.Option) and not param.help and text:
            param.help = text
    if isinstance(cmd, click.Group):
        install(cmd, path + " ")


def _lazy_fault_help(cmd, example: str | None) -> None:
    """The kinds come from fleetspec.lab.faults, imported only when this help is shown."""
    original = cmd.format_help_text

    def format_help_text(self, ctx, formatter):
        if not getattr(self, "_kinds_listed", False):
            self.help = _fault_help(self) + (f"\n\n\b\nExample: {example}" if example else "")
            self._kinds_listed = True
        return original(ctx, formatter)

    cmd.format_help_text = types.MethodType(format_help_text, cmd)

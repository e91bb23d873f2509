"""Rendering units, drop-ins and playbook flags (pure): the one jinja2 environment, sandboxed (a
template or a playbook's flag reaches its data, never Python's internals: no `_` attributes, no
unsafe callables). systemd's quoting is fleetspec.systemd_unit's, offered as filters."""

from __future__ import annotations

import shlex
from pathlib import Path

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from fleetspec.systemd_unit import environment_line, exec_line, oneline, systemd_quote


def environment(root: str | Path | None = None) -> jinja2.Environment:
    """Templates from `<root>/templates/`; undefined names fail loudly (StrictUndefined). Sandboxed:
    a template reaches no Python internals (`__class__`, `__globals__` …), so one planted in a
    fleet root runs no code as the user who renders it (a SecurityError, exit 2)."""
    loader = jinja2.FileSystemLoader(str(Path(root) / "templates")) if root is not None else None
    env = SandboxedEnvironment(loader=loader, undefined=jinja2.StrictUndefined, autoescape=False,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["systemd_quote"] = systemd_quote
    env.filters["exec_line"] = exec_line
    env.filters["oneline"] = oneline
    env.filters["q"] = shlex.quote          # rollback.sh's words
    env.globals["environment_line"] = environment_line
    return env

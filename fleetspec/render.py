"""Rendering units and drop-ins (pure): the one jinja2 environment; systemd's quoting is
fleetspec.systemd_unit's, offered to templates as filters."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import jinja2

from fleetspec.systemd_unit import environment_line, exec_line, oneline, systemd_quote


def environment(root: str | Path | None = None) -> jinja2.Environment:
    """Templates from `<root>/templates/`; undefined names fail loudly (StrictUndefined)."""
    loader = jinja2.FileSystemLoader(str(Path(root) / "templates")) if root is not None else None
    env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, autoescape=False,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["systemd_quote"] = systemd_quote
    env.filters["exec_line"] = exec_line
    env.filters["oneline"] = oneline
    env.globals["environment_line"] = environment_line
    return env


def render_string(template: str, context: Mapping) -> str:
    return environment().from_string(template).render(**context)

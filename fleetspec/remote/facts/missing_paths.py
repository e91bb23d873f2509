"""Which of some paths do not exist on the host (one a line: a path may hold a space)."""

from __future__ import annotations

import shlex


def command(paths: tuple[str, ...] | list[str]) -> str:
    return "; ".join(f"[ -e {shlex.quote(p)} ] || printf '%s\\n' {shlex.quote(p)}" for p in paths) or "true"


def parse(stdout: str, paths: tuple[str, ...] | list[str] = ()) -> list[str]:
    return [p for p in stdout.splitlines() if p in paths]

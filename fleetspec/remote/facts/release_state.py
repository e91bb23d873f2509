"""fleetspec's own state for a service on a host: the active release, the last ledger line,
whether a baseline was recorded (read-only; fleetspec.ops.hoststate does the writing)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from fleetspec.model.layout import HostLayout

_KEYS = ("exists", "current", "baseline", "ledger")


@dataclass(frozen=True)
class ReleaseState:
    managed: bool                 # /var/lib/fleetspec/<service> exists
    current: str | None           # release id `current` points at (None: no symlink)
    baseline: bool
    last_entry: dict[str, Any] | None

    @property
    def release_status(self) -> str | None:
        entry = self.last_entry or {}
        return entry.get("status") or entry.get("state")


def command(service: str) -> str:
    lay = HostLayout(service)
    b, cur, base, led = (shlex.quote(str(p)) for p in (lay.base, lay.current, lay.baseline, lay.ledger))
    return (f"if [ -d {b} ]; then echo exists=yes; else echo exists=no; fi; "
            f"echo current=$(readlink {cur} 2>/dev/null); "
            f"if [ -d {base} ]; then echo baseline=yes; else echo baseline=no; fi; "
            f"printf 'ledger='; tail -n 1 {led} 2>/dev/null; echo")


def parse(stdout: str, service: str = "") -> ReleaseState:
    values: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in _KEYS and key not in values:
            values[key] = value.strip()
    current = values.get("current") or None
    last = None
    if values.get("ledger"):
        try:
            last = json.loads(values["ledger"])
        except json.JSONDecodeError:
            last = {"unparsed": values["ledger"][:200]}
    return ReleaseState(managed=values.get("exists") == "yes",
                        current=PurePosixPath(current).name if current else None,
                        baseline=values.get("baseline") == "yes", last_entry=last)

"""How long a unit has been starting or running: `InactiveExitTimestampMonotonic` (µs since boot,
set when the unit leaves `inactive`/`failed`, i.e. at each (re)start) against /proc/uptime.

Status needs it to tell a model still loading (within its ready timeout) from one that never will.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

NO_SYSTEMCTL = "__FLEETSPEC_NO_SYSTEMCTL__"


@dataclass(frozen=True)
class UnitAge:
    available: bool
    seconds: float | None       # since the unit last left inactive/failed; None if never started


def command(service: str) -> str:
    return (f"command -v systemctl >/dev/null 2>&1 || {{ echo {NO_SYSTEMCTL}; exit 0; }}; "
            f"systemctl show {shlex.quote(service)} -p InactiveExitTimestampMonotonic; "
            f"echo uptime=$(cut -d' ' -f1 /proc/uptime)")


def parse(stdout: str, service: str = "") -> UnitAge:
    if stdout.strip() == NO_SYSTEMCTL:
        return UnitAge(False, None)
    values = dict(line.partition("=")[::2] for line in stdout.splitlines() if "=" in line)
    try:
        exited = int(values.get("InactiveExitTimestampMonotonic") or 0)
        uptime = float(values["uptime"])
    except (KeyError, ValueError):
        raise ValueError(f"unexpected output: {stdout[:120]!r}") from None
    if exited <= 0:
        return UnitAge(True, None)
    return UnitAge(True, round(max(0.0, uptime - exited / 1e6), 1))

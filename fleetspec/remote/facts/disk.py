"""Free space on the filesystem holding a path (`df -P -B1`, POSIX format, bytes)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

_ROW = re.compile(r"^(?P<fs>.*?)\s+(?P<size>\d+)\s+(?P<used>\d+)\s+(?P<avail>\d+)\s+(?P<pct>\d+|-)%?\s+(?P<mount>/.*)$")


@dataclass(frozen=True)
class DiskSpace:
    path: str
    filesystem: str
    size_bytes: int
    used_bytes: int
    free_bytes: int
    mount: str


def command(path: str) -> str:
    # The path may not exist yet (e.g. /var/lib/fleetspec): ask about its nearest existing parent.
    p = shlex.quote(path)
    return (f"p={p}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "
            f"df -P -B1 \"$p\"")


def parse(stdout: str, path: str = "") -> DiskSpace:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ValueError(f"unexpected df output: {stdout[:120]!r}")
    m = _ROW.match(" ".join(lines[1:]))
    if not m:
        raise ValueError(f"unexpected df row: {lines[1][:120]!r}")
    return DiskSpace(path=path, filesystem=m["fs"], size_bytes=int(m["size"]), used_bytes=int(m["used"]),
                     free_bytes=int(m["avail"]), mount=m["mount"])

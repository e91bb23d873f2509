"""Who listens on a service's API port: its own processes, or someone else.

Probes reach the service at 127.0.0.1:<port>. While a new engine loads, the port is free, and any
local user may bind it first and answer /ready, /health, /server_info and /generate as they like.
An answer counts only when every listening socket on the port belongs to a process in the unit's
own cgroup: the unit's ControlGroup (systemctl show) and each listener's pid (`ss -ltnp`) with its
/proc/<pid>/cgroup are read in one command, so they describe the same moment. A port the unit's
process holds cannot be taken over by another user (a second bind fails), so one look after
/ready is enough. The listener's `comm` is reported for the operator; it is the user's text (a
process can name itself anything): the output boundary escapes it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

NO_SS = "__FLEETSPEC_NO_SS__"
NO_SYSTEMCTL = "__FLEETSPEC_NO_SYSTEMCTL__"


@dataclass(frozen=True)
class Listener:
    pid: int
    comm: str
    cgroups: tuple[str, ...]


@dataclass(frozen=True)
class PortOwner:
    port: int
    service: str
    checked: bool                               # False: `ss` or systemctl is missing: nobody can be told apart
    unit_cgroup: str = ""
    listeners: tuple[Listener, ...] = ()
    sockets_without_pid: int = 0
    missing: str = ""                           # what was missing when not checked: "ss" or "systemctl"

    def foreign(self) -> list[Listener]:
        cg = self.unit_cgroup
        return [p for p in self.listeners
                if not cg or not any(c == cg or c.startswith(cg.rstrip("/") + "/") for c in p.cgroups)]

    @property
    def ok(self) -> bool:
        return self.checked and bool(self.unit_cgroup) and bool(self.listeners) and not self.foreign() \
            and not self.sockets_without_pid

    def reason(self) -> str:
        """Why the answers on this port do not count ("" when they do)."""
        where = f"port {self.port}"
        if not self.checked:
            tool = "`ss` (iproute2)" if self.missing == "ss" else "systemctl"
            return f"cannot tell who listens on {where}: {tool} is not on the host"
        if not self.listeners and not self.sockets_without_pid:
            return f"nothing listens on {where}"
        others = [f"pid {p.pid} ({p.comm})" for p in self.foreign()]
        if self.sockets_without_pid:
            others.append(f"{self.sockets_without_pid} socket(s) with no process shown")
        if others:
            owner = f"cgroup {self.unit_cgroup}" if self.unit_cgroup else "which is not running"
            return (f"{where} is held by {', '.join(others)}, not by a process of {self.service} ({owner}): "
                    f"its answers are not the service's")
        return "" if self.unit_cgroup else f"{self.service} has no cgroup (not running)"


def command(service: str, port: int) -> str:
    s, p = shlex.quote(service), int(port)
    return (f"cg=$(systemctl show -p ControlGroup --value -- {s} 2>/dev/null) || {{ echo {NO_SYSTEMCTL}; exit 0; }}; "
            f"command -v ss >/dev/null 2>&1 || {{ echo {NO_SS}; exit 0; }}; "
            "printf 'cgroup %s\\n' \"$cg\"; "
            f"ss -Hltnp 'sport = :{p}' 2>/dev/null | while read -r line; do "
            "pids=$(printf '%s\\n' \"$line\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -un | tr '\\n' ' '); "
            "printf 'sock %s\\n' \"$pids\"; for pid in $pids; do "
            "printf 'pid %s %s\\n' \"$pid\" \"$(cut -d: -f3- /proc/$pid/cgroup 2>/dev/null | tr '\\n' '|')\"; "
            "printf 'comm %s %s\\n' \"$pid\" \"$(od -An -c /proc/$pid/comm 2>/dev/null | tr -s ' \\n' ' ')\"; "
            "done; done")


def _comm(od_text: str) -> str:
    """/proc/<pid>/comm as `od -c` printed it (so no byte of it could end or forge a line), back to text."""
    escapes = {"\\n": b"\n", "\\t": b"\t", "\\r": b"\r", "\\0": b"", "\\a": b"\a", "\\b": b"\b",
               "\\f": b"\f", "\\v": b"\v", "\\\\": b"\\"}
    out = bytearray()
    for word in od_text.split(" "):
        if word in escapes:
            out += escapes[word]
        elif len(word) == 3 and word.isdigit():
            out.append(int(word, 8) & 0xFF)
        elif word:
            out += word.encode()
    return out.decode("utf-8", "replace").strip("\n")


def parse(stdout: str, service: str = "", port: int = 0) -> PortOwner:
    if stdout.strip() in (NO_SS, NO_SYSTEMCTL):
        return PortOwner(port, service, checked=False, missing="ss" if stdout.strip() == NO_SS else "systemctl")
    cgroup, bare = "", 0
    pids: dict[int, tuple[str, ...]] = {}
    comms: dict[int, str] = {}
    seen: list[int] = []
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "cgroup":
            cgroup = rest.strip()
        elif kind == "sock":
            found = [int(w) for w in rest.split() if w.isdigit()]
            bare += not found
            seen.extend(p for p in found if p not in seen)
        elif kind == "pid":
            pid, _, paths = rest.partition(" ")
            if pid.isdigit():
                pids[int(pid)] = tuple(p for p in paths.split("|") if p)
        elif kind == "comm":
            pid, _, text = rest.partition(" ")
            if pid.isdigit():
                comms[int(pid)] = _comm(text)
    listeners = tuple(Listener(p, comms.get(p, "?"), pids.get(p, ())) for p in seen)
    return PortOwner(port, service, True, cgroup, listeners, bare)

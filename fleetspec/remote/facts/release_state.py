"""fleetspec's own state for a service on a host: the active release, the last ledger line,
whether a baseline was recorded (read-only; fleetspec.ops.hoststate does the writing)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from fleetspec.model import hostjson
from fleetspec.model.layout import HostLayout

_KEYS = ("exists", "current", "baseline", "ledger", "status", "current_status", "lock", "holder", "router")


@dataclass(frozen=True)
class ReleaseState:
    managed: bool                 # /var/lib/fleetspec/<service> exists
    current: str | None           # release id `current` points at (None: no symlink)
    baseline: bool
    last_entry: dict[str, Any] | None
    last_status: dict[str, Any] | None = None   # the last `"kind": "status"` ledger line
    current_status: dict[str, Any] | None = None  # the last status line of the current release
    locked: bool = False                        # a deploy/rollback holds the lock right now
    holder: dict[str, Any] | None = None        # who holds it (lock.holder), when locked
    last_router: dict[str, Any] | None = None   # the last `"kind": "router"` ledger line (ops/drain.py)

    @property
    def drained(self) -> dict[str, Any] | None:
        """{router, worker} of a worker taken out of its router and not put back: a command cut off
        while the host was drained (or one running now, when locked)."""
        from fleetspec.model import ledger as L

        entry = self.last_router if isinstance(self.last_router, dict) else {}
        detail = entry.get("detail")             # a line root on the host wrote: any JSON at all
        return (dict(detail) if isinstance(detail, dict) else {}) if entry.get("state") == L.DRAINED else None

    @property
    def interrupted(self) -> str | None:
        """A one-line note when the last deploy died mid-way (lock free, story unfinished)."""
        from fleetspec.model import ledger as L

        if self.locked or self.prestaged:
            return None
        last, status = self.last_entry or {}, self.last_status or {}
        if status and status.get("state") not in L.TERMINAL:
            where = (f"after step {last.get('name')}" if last.get("release") == status.get("release")
                     and last.get("kind") == "step" else "")
            if status.get("state") != L.SWITCHED:   # staged: nothing that runs was changed
                return (f"deploy {status.get('release')} died {where} before switching (host unchanged)"
                        .replace("  ", " "))
            return (f"deploy {status.get('release')} was interrupted {where} while {status.get('state')}"
                    .replace("  ", " "))
        if last.get("kind") == "step" and last.get("state") == "started" and last.get("name") != "rollback":
            return f"deploy {last.get('release')} died at step {last.get('name')} before switching (host unchanged)"
        return None

    @property
    def prestaged(self) -> str | None:
        """The release a `deploy --prestage` or `deploy --stage-only` staged here, when nothing was
        written after it: it waits for this host's deploy in the rollout, or for the next deploy
        of its algo (`staged_ahead`); a prestage whose rollout stopped, for the next deploy to mark
        it failed. Not a deploy that died: nothing was switched or left half done."""
        from fleetspec.model import ledger as L

        last, status = self.last_entry or {}, self.last_status or {}
        detail = status.get("detail") or {}
        if (not self.locked and status.get("state") == L.STAGED and (detail.get("prestage") or detail.get("ahead"))
                and last == status):
            return status.get("release")
        return None

    @property
    def staged_ahead(self) -> str | None:
        """The algo of the release `prestaged` names, when `deploy --stage-only` staged it."""
        detail = (self.last_status or {}).get("detail") or {}
        return detail.get("algo") if self.prestaged and detail.get("ahead") else None

    @property
    def needs_rollback(self) -> bool:
        """The interrupted deploy had switched the service: only a rollback finishes it."""
        status = self.last_status or {}
        from fleetspec.model import ledger as L

        return bool(self.interrupted) and status.get("state") == L.SWITCHED

    @property
    def release_status(self) -> str | None:
        """The current release's latest status (model.ledger: healthy, failed, rolled_back…)."""
        entry = self.current_status or {}
        if not self.current or entry.get("release") != self.current:
            return None
        return entry.get("state")


def command(service: str) -> str:
    lay = HostLayout(service)
    b, cur, base, led, lk = (shlex.quote(str(p)) for p in (lay.base, lay.current, lay.baseline, lay.ledger, lay.lock))
    return (f"if [ -d {b} ]; then echo exists=yes; else echo exists=no; fi; "
            f"echo current=$(readlink {cur} 2>/dev/null); "
            f"if [ -d {base} ]; then echo baseline=yes; else echo baseline=no; fi; "
            f"printf 'ledger='; tail -n 1 {led} 2>/dev/null; echo; "
            f"printf 'status='; grep -E '\"kind\": ?\"status\"' {led} 2>/dev/null | tail -n 1; echo; "
            f"rid=$(basename \"$(readlink {cur} 2>/dev/null)\"); printf 'current_status='; "
            f"[ -n \"$rid\" ] && grep -F \"\\\"release\\\":\\\"$rid\\\"\" {led} 2>/dev/null | "
            f"grep -E '\"kind\": ?\"status\"' | tail -n 1; echo; "
            f"printf 'router='; grep -E '\"kind\": ?\"router\"' {led} 2>/dev/null | tail -n 1; echo; "
            f"if [ -e {lk} ] && ! flock -n {lk} true 2>/dev/null; then echo lock=held; "
            f"printf 'holder='; cat {shlex.quote(str(lay.lock) + '.holder')} 2>/dev/null; echo; else echo lock=free; fi")


def parse(stdout: str, service: str = "") -> ReleaseState:
    values: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in _KEYS and key not in values:
            values[key] = value.strip()
    current = values.get("current") or None
    return ReleaseState(managed=values.get("exists") == "yes",
                        current=PurePosixPath(current).name if current else None,
                        baseline=values.get("baseline") == "yes", last_entry=_json(values.get("ledger")),
                        last_status=_json(values.get("status")), current_status=_json(values.get("current_status")),
                        locked=values.get("lock") == "held", last_router=_json(values.get("router")),
                        holder=_json(values.get("holder")) if values.get("lock") == "held" else None)


def _json(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = hostjson.loads(text)
    except ValueError:
        return {"unparsed": text[:200]}
    return value if isinstance(value, dict) else {"unparsed": text[:200]}

"""A rollout: one `deploy` or `rollback` of one or more hosts, as a record the controller keeps.

The id is written in each host's ledger lines (detail `rollout`) and names the record file under
the fleet root (ops/rollouts.py). The record holds what `promote` needs to go on with the same
rollout from another shell (its batches, strategy, playbook and options) and what `rollouts show`
tells afterwards (who ran it, the command, each host's outcome, timings and gate figures).
Pure: JSON in and out; a record that does not read as one is refused naming the file.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# `<UTC date>-<UTC time>-<4 hex>`: sortable by when it began, short enough to type.
ID_PATTERN = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}$")
PAUSE_POINTS = ("canary", "each-batch")
# running: a process holds it; paused: waits for promote or abort; the rest are final
# (a record still `running` whose lock is free was cut off: abort is the way out).
STATES = ("running", "paused", "done", "failed", "aborted")
VERSION = 1


def new_rollout_id(now: float | None = None) -> str:
    """Sortable by time, unique without coordination (the record is created exclusively)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(2)}"


def is_rollout_id(text: object) -> bool:
    return isinstance(text, str) and bool(ID_PATTERN.match(text))


@dataclass
class HostRun:
    """One host's part: its outcome as the deploy (or rollback) reported it."""
    status: str = "pending"            # pending (a later batch) | healthy | failed | rolled_back | …
    batch: int = 0
    release: str | None = None         # the release it went to (a rollback: its target)
    previous: str | None = None        # what it ran before this rollout: a release id or "baseline"
    started: float | None = None
    ended: float | None = None
    seconds: float = 0.0
    failed_step: str | None = None
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0


@dataclass
class Record:
    id: str
    kind: str                          # deploy | rollback
    by: str
    command: list[str]
    created: float
    batches: list[list[str]]
    state: str = "running"
    algo: str | None = None
    to: str | None = None              # a rollback's --to
    sets: list[str] = field(default_factory=list)
    waive_gpu: list[str] = field(default_factory=list)
    playbook_sha256: str | None = None
    mode: str = "release"
    run_gates: bool = True
    allow_unhealthy: bool = False
    strategy: dict[str, Any] = field(default_factory=dict)   # ops.fleet.Strategy's fields
    pause_after: str | None = None
    next_batch: int = 0                # the first batch not run yet
    failures: int = 0                  # hosts failed so far, against strategy["max_fail"]
    hosts: dict[str, HostRun] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)   # {ts, by, what}: started, paused, promoted, aborted, …

    def note(self, what: str, by: str, now: float | None = None) -> None:
        self.events.append({"ts": now if now is not None else time.time(), "by": by, "what": what})

    def host_order(self) -> list[str]:
        return [name for batch in self.batches for name in batch]

    def changed(self) -> list[str]:
        """The hosts this rollout moved and left on its release: what `abort` puts back."""
        return [n for n in self.host_order() if self.hosts.get(n, HostRun()).status == "healthy"]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["version"] = VERSION
        return out

    @classmethod
    def from_json(cls, raw: Any, where: str) -> "Record":
        """A record as written by to_json; ValueError naming `where` and the key for anything else."""
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: expected a JSON object")
        if raw.get("version") != VERSION:
            raise ValueError(f"{where}: version {raw.get('version')!r}, expected {VERSION}")
        data = {k: v for k, v in raw.items() if k != "version"}
        try:
            hosts = {str(k): HostRun(**v) for k, v in (data.pop("hosts", None) or {}).items()}
            record = cls(**data, hosts=hosts)
        except (TypeError, AttributeError) as err:
            raise ValueError(f"{where}: {err}") from None
        problems = [
            ("id", is_rollout_id(record.id)),
            ("kind", record.kind in ("deploy", "rollback")),
            ("state", record.state in STATES),
            ("batches", isinstance(record.batches, list) and all(
                isinstance(b, list) and all(isinstance(n, str) for n in b) for b in record.batches)),
            ("pause_after", record.pause_after in (None, *PAUSE_POINTS)),
            ("next_batch", isinstance(record.next_batch, int) and 0 <= record.next_batch <= len(record.batches)),
            ("hosts", set(record.hosts) <= set(record.host_order())),
        ]
        bad = [key for key, ok in problems if not ok]
        if bad:
            raise ValueError(f"{where}: {bad[0]} is not as a rollout record has it ({getattr(record, bad[0])!r})")
        return record


def pauses_after(pause_after: str | None, number: int, batches: int, canary: bool) -> bool:
    """Whether a rollout stops after batch `number` (0-based) with every host healthy: after the
    canary batch, or after each batch; never after the last (there is nothing left to promote)."""
    if number >= batches - 1 or pause_after is None:
        return False
    if pause_after == "canary":
        return canary and number == 0
    return True

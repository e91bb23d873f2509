"""The ledger: append-only JSON lines recording every release and every step, on the host and
mirrored locally. Reading never crashes on a torn or corrupt line: it is skipped and reported.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import StrEnum
from typing import Any, Iterable

from fleetspec.model.names import is_name


class ReleaseStatus(StrEnum):
    """A release's status (`"kind": "status"` lines), in the order a healthy deploy goes through
    them. The values are the ledger's words on disk; a member compares equal to its word."""
    STARTED = "started"
    STAGED = "staged"
    SWITCHED = "switched"
    HEALTHY = "healthy"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    SUPERSEDED = "superseded"
    PRUNED = "pruned"


class StepState(StrEnum):
    """A step's state (`"kind": "step"` lines)."""
    STARTED = "started"
    OK = "ok"
    FAILED = "failed"


STARTED, STAGED, SWITCHED, HEALTHY = (ReleaseStatus.STARTED, ReleaseStatus.STAGED, ReleaseStatus.SWITCHED,
                                      ReleaseStatus.HEALTHY)
FAILED, ROLLED_BACK, SUPERSEDED, PRUNED = (ReleaseStatus.FAILED, ReleaseStatus.ROLLED_BACK,
                                           ReleaseStatus.SUPERSEDED, ReleaseStatus.PRUNED)
TERMINAL = {HEALTHY, FAILED, ROLLED_BACK, SUPERSEDED, PRUNED}


# Router lines: kind `router`, release `router`, state drained | restored, detail {router, worker}.
ROUTER, DRAINED, RESTORED = "router", "drained", "restored"


def router_entry(state: str, router: str, worker: str, **detail: Any) -> "Entry":
    """Written before the router is asked to remove (drained) and after it lists the worker again."""
    return Entry(ROUTER, ROUTER, "worker", state, detail={"router": router, "worker": worker, **detail})


def actor() -> str:
    """Who is acting: user@machine:pid, so a ledger line and a lock name their author."""
    return f"{os.environ.get('USER') or os.getuid()}@{socket.gethostname()}:{os.getpid()}"


def _jsonable(value: Any) -> Any:
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else str(value)


@dataclass(frozen=True)
class Entry:
    """One ledger line. `kind` is `step` (a step started/finished) or `status` (a release changed state)."""

    kind: str
    release: str
    name: str
    state: str
    ts: float = field(default_factory=time.time)
    by: str = field(default_factory=actor)
    detail: dict[str, Any] = field(default_factory=dict)

    def to_line(self) -> str:
        """The JSON line; `detail` is serialised as it is (asdict's deep copy of it cost more than
        the JSON), a dataclass inside it as its fields, anything else JSON lacks as its str."""
        fields = {"by": self.by, "detail": self.detail, "kind": self.kind, "name": self.name,
                  "release": self.release, "state": self.state, "ts": self.ts}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=_jsonable)

    @classmethod
    def step(cls, release: str, name: str, state: str, **detail: Any) -> "Entry":
        return cls("step", release, name, state, detail=detail)

    @classmethod
    def status(cls, release: str, state: str, **detail: Any) -> "Entry":
        return cls("status", release, "release", state, detail=detail)


@dataclass(frozen=True)
class ParsedLedger:
    entries: tuple[Entry, ...]
    skipped: tuple[int, ...]  # 1-based line numbers that were torn or not ledger entries
    numbers: tuple[int, ...] = ()   # each entry's 1-based line number

    def releases(self) -> dict[str, str]:
        """Each release's latest status, in order of first appearance."""
        out: dict[str, str] = {}
        for e in self.entries:
            if e.release == "baseline" or e.kind == ROUTER:   # retake/repair and router lines: no release
                continue
            if e.kind == "status":
                out[e.release] = e.state
            else:
                out.setdefault(e.release, STARTED)
        return out

    def staged_ahead(self, algo: str | None = None) -> list[str]:
        """Releases `deploy --stage-only` staged (for `algo`, when given) that nothing has used or
        abandoned since: their latest status is still that stage's "staged" line. Oldest first."""
        latest: dict[str, Entry] = {}
        for e in self.entries:
            if e.kind == "status" and e.release != "baseline":
                latest[e.release] = e
        return sorted(r for r, e in latest.items() if e.state == STAGED and e.detail.get("ahead")
                      and (algo is None or e.detail.get("algo") == algo))

    def drained(self) -> Entry | None:
        """The router line of a worker taken out and not yet put back (a deploy cut off mid-drain),
        so `status` shows it and the next deploy or rollback puts it back."""
        last = None
        for e in self.entries:
            if e.kind == ROUTER:
                last = e
        return last if last is not None and last.state == DRAINED else None

    def last_step(self, release: str) -> Entry | None:
        steps = [e for e in self.entries if e.release == release and e.kind == "step"]
        return steps[-1] if steps else None

    def interrupted(self) -> list[str]:
        """Releases that never reached a terminal status: a deploy died or was cut off mid-way."""
        return [r for r, s in self.releases().items() if s not in TERMINAL]

    def figures(self, release: str) -> dict[str, Any]:
        """Gate figures recorded for a release (merged from its `gates` step entries)."""
        merged: dict[str, Any] = {}
        for e in self.entries:
            if e.release == release and e.name == "gates" and e.detail.get("figures"):
                merged.update(e.detail["figures"])
        return merged


def parse(text: str) -> ParsedLedger:
    """The entries of a ledger's text, torn or foreign lines skipped. Kept for the last few texts:
    a deploy reads the host's whole ledger once under its lock and several of its steps ask it, and
    a long-lived host's ledger only grows (10,000 lines: 1.8 MB, ~60 ms of CPU to parse here)."""
    return _parse(text)


@functools.lru_cache(maxsize=8)
def _parse(text: str) -> ParsedLedger:
    entries, skipped, numbers = [], [], []
    for number, line in enumerate(text.split("\n"), 1):   # not splitlines: \x85 or U+2028 inside a line is no line end
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            entry = Entry(**{k: raw[k] for k in ("kind", "release", "name", "state", "ts", "by", "detail")})
        except (ValueError, KeyError, TypeError):
            skipped.append(number)
            continue
        if not is_name(entry.release):      # it becomes a path part (prune, revert): a hostile one is no entry
            skipped.append(number)
            continue
        entries.append(entry)
        numbers.append(number)
    return ParsedLedger(tuple(entries), tuple(skipped), tuple(numbers))


# A deploy reads and parses the host's whole ledger under its lock. Past this size a healthy
# deploy's last command moves the lines of pruned releases out (`rotation`): ~1,400 lines, about
# 55 deploys; the lines a deploy still asks about stay far below it (bench/ledger_size.py).
ROTATE_AT_BYTES = 256 * 1024


def rotation(text: str, at_bytes: int = ROTATE_AT_BYTES) -> list[tuple[int, int]]:
    """The 1-based, inclusive line ranges of `text` (a host's ledger as read under the lock) that
    may leave it for the archive: every line of a release whose status is PRUNED (its folder is
    gone; only `history` asks about it, and it reads the archive too). Empty below `at_bytes`.
    Torn lines, baseline lines and every other release's lines stay."""
    if len(text) < at_bytes:
        return []
    parsed = parse(text)
    gone = {r for r, s in parsed.releases().items() if s == PRUNED}
    ranges: list[tuple[int, int]] = []
    for entry, number in zip(parsed.entries, parsed.numbers, strict=True):
        if entry.release not in gone:
            continue
        if ranges and ranges[-1][1] == number - 1:
            ranges[-1] = (ranges[-1][0], number)
        else:
            ranges.append((number, number))
    return ranges


def without_repeats(text: str) -> str:
    """A ledger and its archives read one after the other, each line once: a rotation keeps the
    old file whole in the archive, so the lines it kept are in both (and in both twice over when
    it was cut off between its link and its rename)."""
    seen: set[str] = set()
    out = []
    for line in text.split("\n"):
        if line.strip():
            if line in seen:
                continue
            seen.add(line)
        out.append(line)
    return "\n".join(out)


def render(entries: Iterable[Entry]) -> str:
    return "".join(e.to_line() + "\n" for e in entries)

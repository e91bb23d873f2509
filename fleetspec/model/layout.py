"""Where fleetspec keeps its state: one folder per service under /var/lib/fleetspec on a host, and
a copy of each host service's ledger and baseline under the fleet root's .fleetspec/ folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

STATE_ROOT = PurePosixPath("/var/lib/fleetspec")


def _under(where: str, name: str, doc: str = "") -> property:
    """A path `name` under `self.<where>` (`base`: the service's folder; `root`: the state root)."""
    return property(lambda self: getattr(self, where) / name, doc=doc)


@dataclass(frozen=True)
class HostLayout:
    service: str
    root: PurePosixPath = STATE_ROOT

    @property
    def base(self) -> PurePosixPath:
        return self.root / self.service.removesuffix(".service")

    baseline = _under("base", "baseline")
    releases = _under("base", "releases")
    current = _under("base", "current")
    ledger = _under("base", "ledger.jsonl")
    lock = _under("base", "lock")
    run = _under("root", "run", "Root-only (0700) folder where remote python starts and scratch folders are made.")
    objects = _under("root", "objects",
                     "Content-addressed store of uploaded files (sha256 names), so nothing is sent twice.")

    def release(self, release_id: str) -> PurePosixPath:
        return self.releases / release_id


def local_mirror(root: Path, host_name: str, service: str) -> Path:
    """The fleet root's copy of a host service's ledger and baseline: written beside every ledger
    line and baseline, read when the host cannot be reached or its baseline is damaged."""
    return Path(root) / ".fleetspec" / "hosts" / host_name / service

"""Where fleetspec keeps its state on a host: one folder per service under /var/lib/fleetspec."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

STATE_ROOT = PurePosixPath("/var/lib/fleetspec")


@dataclass(frozen=True)
class HostLayout:
    service: str
    root: PurePosixPath = STATE_ROOT

    @property
    def base(self) -> PurePosixPath:
        return self.root / self.service.removesuffix(".service")

    @property
    def baseline(self) -> PurePosixPath:
        return self.base / "baseline"

    @property
    def releases(self) -> PurePosixPath:
        return self.base / "releases"

    def release(self, release_id: str) -> PurePosixPath:
        return self.releases / release_id

    @property
    def current(self) -> PurePosixPath:
        return self.base / "current"

    @property
    def ledger(self) -> PurePosixPath:
        return self.base / "ledger.jsonl"

    @property
    def lock(self) -> PurePosixPath:
        return self.base / "lock"

    @property
    def run(self) -> PurePosixPath:
        """Root-only (0700) folder where remote python starts and scratch folders are made."""
        return self.root / "run"

    @property
    def objects(self) -> PurePosixPath:
        """Content-addressed store of uploaded files (sha256 names), so nothing is sent twice."""
        return self.root / "objects"

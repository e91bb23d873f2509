"""Where fleetspec keeps its state: one folder per service under /var/lib/fleetspec on a host, and
a copy of each host service's ledger and baseline under the fleet root's .fleetspec/ folder."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

STATE_ROOT = PurePosixPath("/var/lib/fleetspec")


class _Under:
    """A path `name` under the layout's `where` folder (`base`: the service's; `root`: the state root)."""

    def __init__(self, where: str, name: str) -> None:
        self.where, self.name = where, name

    def __get__(self, layout: object, owner: type | None = None) -> PurePosixPath:
        return PurePosixPath(getattr(layout, self.where), self.name)


@dataclass(frozen=True)
class HostLayout:
    service: str
    root: PurePosixPath = STATE_ROOT

    @property
    def base(self) -> PurePosixPath:
        return self.root / self.service.removesuffix(".service")

    baseline = _Under("base", "baseline")
    releases = _Under("base", "releases")
    current = _Under("base", "current")
    ledger = _Under("base", "ledger.jsonl")
    ledger_archive = _Under("base", "ledger-archive")   # ledger.<stamp>.jsonl: each the whole ledger a rotation replaced
    lock = _Under("base", "lock")
    run = _Under("root", "run")            # root-only (0700): where remote python starts, scratch folders
    objects = _Under("root", "objects")    # content-addressed uploads (sha256 names): nothing is sent twice
    smoke_verdicts = _Under("root", "smoke-verdicts")   # root-only: passing smoke outputs, replayed while nothing changed

    def release(self, release_id: str) -> PurePosixPath:
        return self.releases / release_id


def mirror_key(host: Any) -> str:
    """`<name>@<address>_<port>`: two inventories may give one name to different machines (the
    lab's ct129 and a production ct129), and one machine's copy must never serve the other. A
    str is taken as it is (a glob pattern)."""
    if isinstance(host, str):
        return host
    return f"{host.name}@{re.sub(r'[^A-Za-z0-9._-]', '_', str(host.address))}_{int(host.port)}"


def local_mirror(root: Path, host: Any, service: str) -> Path:
    """The fleet root's copy of a host service's ledger and baseline: written beside every ledger
    line and baseline, read when the host cannot be reached or its baseline is damaged. Keyed by
    the host's name and address (mirror_key); its identity.json holds the host key it was taken
    from, which a repair must see again (ops/hoststate.py)."""
    return Path(root) / ".fleetspec" / "hosts" / mirror_key(host) / service

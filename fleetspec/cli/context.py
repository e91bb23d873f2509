"""What every command shares: the fleet root, the inventory, transport options (loaded lazily)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path


@dataclass
class Context:
    root: str | None = None
    inventory: str | None = None
    accept_new_host_key: bool = False
    _cache: dict = field(default_factory=dict, repr=False)

    @cached_property
    def root_path(self) -> Path:
        from fleetspec.root import find_root

        return find_root(self.root)

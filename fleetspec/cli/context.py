"""What every command shares: the fleet root, the inventory, one SSH connection per host
(loaded lazily, so `--help` and bad input never touch the network)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path


@dataclass
class Context:
    root: str | None = None
    inventory: str | None = None
    accept_new_host_key: bool = False
    _cache: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @cached_property
    def root_path(self) -> Path:
        from fleetspec.root import find_root

        return find_root(self.root)

    @cached_property
    def inventory_obj(self):
        from fleetspec.model.inventory import load_inventory, resolve_inventory_path

        return load_inventory(resolve_inventory_path(self.root_path, self.inventory))

    def select(self, targets, all_hosts: bool = False) -> list:
        """Hosts named by `name`, `@group` or --all; nothing named is bad input."""
        from fleetspec.errors import UserError

        if not targets and not all_hosts:
            raise UserError("name hosts (HOST, @group) or use --all")
        return self.inventory_obj.select(targets, all_hosts=all_hosts)

    @cached_property
    def pool(self):
        from fleetspec.remote.transport import TransportPool

        return TransportPool(accept_new_host_key=self.accept_new_host_key)

    def transport(self, host):
        with self._lock:
            return self.pool.get(host)

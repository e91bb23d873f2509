"""What every command shares: the fleet root, the inventory, transport options (loaded lazily).

Nothing is read until a command asks for it, so `fleetspec --help` works anywhere and a bad
inventory only stops the commands that need one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path


@dataclass
class Context:
    root: str | None = None
    inventory: str | None = None
    accept_new_host_key: bool = False
    no_color: bool = False          # --no-color (NO_COLOR is read where output is styled: cli/terminal.styled)

    @cached_property
    def root_path(self) -> Path:
        from fleetspec.root import find_root

        return find_root(self.root)

    @cached_property
    def inventory_path(self) -> Path:
        from fleetspec.model.inventory import resolve_inventory_path

        return resolve_inventory_path(self.root_path, self.inventory)

    @cached_property
    def inv(self):
        """The loaded inventory (fleetspec.model.inventory.Inventory)."""
        from fleetspec.model.inventory import load_inventory

        return load_inventory(self.inventory_path)

    def select(self, tokens=(), all_hosts: bool = False, default_all: bool = False) -> list:
        """Hosts named by host patterns (model/hostpattern.py) / --all; nothing named is an error
        unless default_all. --all beside named hosts is refused: one of them is a mistake."""
        from fleetspec.errors import UserError

        tokens = list(tokens)
        if all_hosts and tokens:
            raise UserError(f"--all selects every host of {self.inventory_path}; it cannot be combined with "
                            f"{' '.join(tokens)}: drop --all or the names")
        if not tokens and not all_hosts:
            if not default_all:
                raise UserError(f"name hosts (HOST or @group) or pass --all (inventory {self.inventory_path})")
            all_hosts = True
        return self.inv.select(tokens, all_hosts=all_hosts)

    def select_one(self, token: str, command: str):
        """The one host a single-host command acts on: a host name, never a group or a pattern
        that names several (the command would otherwise act on the first without saying so)."""
        from fleetspec.errors import UserError

        if token in self.inv.hosts and token not in self.inv.groups:
            return self.inv.hosts[token]
        hosts = self.inv.select([token])
        names = ", ".join(h.name for h in hosts[:4]) + (", …" if len(hosts) > 4 else "")
        raise UserError(f"{command} acts on one host; {token!r} names {len(hosts)} ({names}) in "
                        f"{self.inventory_path}: name one host")

    @cached_property
    def pool(self):
        """One SSH connection per host for the whole command; closed when the command ends."""
        import click

        from fleetspec.remote.transport import TransportPool

        pool = TransportPool(accept_new_host_key=self.accept_new_host_key)
        ctx = click.get_current_context(silent=True)
        if ctx is not None:
            ctx.find_root().call_on_close(pool.close_all)
        return pool

    def transport(self, host):
        return self.pool.get(host)

"""A transport whose commands carry a prelude: what `ops/hoststate.py` has deferred (ledger lines).

DEVELOPING.md, "Ledger lines ride in the step's work", is the contract.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Callable

from fleetspec.remote.api import Channel, CommandResult, Prelude, TransportLike


class Carrying:
    """The deploy's transport: every command carries the deferred ledger lines in front of its
    own work (`prelude`: ops/hoststate.py's HostState.prelude), so a step's lines cost no command
    of their own. An SFTP write outside fleetspec's state root (a host change) and a long-lived
    command without a prelude send them first (`flush`); HTTP requests change nothing and leave
    them waiting. A transport that takes no prelude gets them flushed before each command."""

    def __init__(self, t: TransportLike, prelude: Callable[[], Prelude | None], flush: Callable[[], None], own_root: str):
        self._t = t
        self._take, self._flush, self._root = prelude, flush, own_root

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

    def _prelude(self) -> Prelude | None:
        if getattr(self._t, "carries_preludes", False):     # a stand-in without preludes: flushed first
            return self._take()
        self._flush()
        return None

    def run(self, argv, timeout=None, check=False, stdin=None, prelude: Prelude | None = None) -> CommandResult:
        prelude = prelude or self._prelude()
        if prelude is None:
            return self._t.run(argv, timeout, check, stdin)
        return self._t.run(argv, timeout, check, stdin, prelude=prelude)

    def run_script(self, script, timeout=None, check=False, stdin=None, prelude: Prelude | None = None) -> CommandResult:
        prelude = prelude or self._prelude()
        if prelude is None:
            return self._t.run_script(script, timeout, check, stdin)
        return self._t.run_script(script, timeout, check, stdin, prelude=prelude)

    def put_bytes(self, data: bytes, path: str, mode: int = 0o644, durable: bool = True) -> None:
        if not PurePosixPath(path).is_relative_to(self._root):
            self._flush()
        return self._t.put_bytes(data, path, mode, durable)

    def take_prelude(self) -> Prelude | None:
        """The deferred lines for a long-lived command that settles them itself (systemd.UnitStream)."""
        return self._prelude()

    def open_exec(self, script: str, prelude: Prelude | None = None) -> Channel:
        if prelude is None:
            self._flush()
            return self._t.open_exec(script)
        return self._t.open_exec(script, prelude=prelude)

"""What a host connection returns, and the interface ops/ and the fact layer program against.

`TransportLike` is the typed parameter every remote function takes (`t`): the real
`transport.Transport`, or a test's stand-in with the same methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from fleetspec.model import hostjson
from fleetspec.model.inventory import Host


@dataclass
class CommandResult:
    command: str
    rc: int
    stdout: str
    stderr: str
    stdout_bytes: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON; ValueError for any body that is not (bad UTF-8, nesting too deep)."""
        return hostjson.loads(self.body.decode("utf-8"))

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class Prelude(Protocol):
    """Shell run before a command in the same remote shell (ops/hoststate.py: deferred ledger
    lines). `script` ends with a newline; `settle` gets the command's result, raises when the
    prelude itself failed (then nothing of the command ran) and else returns the result as is."""

    script: str

    def settle(self, result: CommandResult) -> CommandResult: ...


class Channel(Protocol):
    """A long-lived command's exec channel (paramiko.Channel): what the lock's holder, the stage
    step and the readiness watch read and write."""

    status_event: Any

    def send(self, data: bytes) -> int: ...

    def recv(self, nbytes: int) -> bytes: ...

    def recv_ready(self) -> bool: ...

    def recv_stderr(self, nbytes: int) -> bytes: ...

    def recv_stderr_ready(self) -> bool: ...

    def recv_exit_status(self) -> int: ...

    def exit_status_ready(self) -> bool: ...

    def settimeout(self, timeout: float | None) -> None: ...

    def shutdown_write(self) -> None: ...

    def close(self) -> None: ...

    def fileno(self) -> int: ...


class TransportLike(Protocol):
    """A connection to one host, as everything above remote/ uses it: commands (with a ledger
    `prelude` run first in the same shell), long-lived commands, atomic file transfer, HTTP to its
    loopback, and the sudo check. remote/transport.Transport is the one implementation."""

    carries_preludes: bool

    @property
    def name(self) -> str: ...

    @property
    def host(self) -> Host: ...

    @property
    def needs_sudo(self) -> bool: ...

    def check_access(self) -> None: ...

    def run(self, argv: Sequence[str], timeout: float | None = None, check: bool = False,
            stdin: bytes | None = None, prelude: Prelude | None = None) -> CommandResult: ...

    def run_script(self, script: str, timeout: float | None = None, check: bool = False,
                   stdin: bytes | None = None, prelude: Prelude | None = None) -> CommandResult: ...

    def open_exec(self, script: str, prelude: Prelude | None = None) -> Channel: ...

    def put_bytes(self, data: bytes, path: str, mode: int = 0o644, durable: bool = True) -> None: ...

    def get_bytes(self, path: str) -> bytes: ...

    def http(self, method: str, port: int, path: str, json: Any = None, timeout: float = 5,
             headers: dict[str, str] | None = None) -> HttpResponse: ...

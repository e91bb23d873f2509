"""What a host connection returns, and the interface ops/ and the fact layer program against.

`TransportLike` is the typed parameter every remote function takes (`t`): the real
`transport.Transport`, or a test's stand-in with the same methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from fleetspec.model import hostjson


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


class TransportLike(Protocol):
    """A connection to one host: commands, atomic file transfer, HTTP to its loopback."""

    @property
    def name(self) -> str: ...

    def run(self, argv: Sequence[str], timeout: float | None = None, check: bool = False,
            stdin: bytes | None = None) -> CommandResult: ...

    def run_script(self, script: str, timeout: float | None = None, check: bool = False,
                   stdin: bytes | None = None) -> CommandResult: ...

    def put_bytes(self, data: bytes, path: str, mode: int = 0o644, durable: bool = True) -> None: ...

    def get_bytes(self, path: str) -> bytes: ...

    def http(self, method: str, port: int, path: str, json: Any = None, timeout: float = 5,
             headers: dict[str, str] | None = None) -> HttpResponse: ...


class CarryingTransport(TransportLike, Protocol):
    """A transport whose commands take a `prelude` (remote/transport.Transport), and whose
    long-lived commands (the lock's holder, the readiness watch) the caller reads itself."""

    carries_preludes: bool

    def run(self, argv: Sequence[str], timeout: float | None = None, check: bool = False,
            stdin: bytes | None = None, prelude: Prelude | None = None) -> CommandResult: ...

    def run_script(self, script: str, timeout: float | None = None, check: bool = False,
                   stdin: bytes | None = None, prelude: Prelude | None = None) -> CommandResult: ...

    def open_exec(self, script: str, prelude: Prelude | None = None) -> Any: ...

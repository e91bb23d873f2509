"""HTTP/1.1 to 127.0.0.1:<port> on a host, through a direct-tcpip channel of its SSH connection.

A part of `transport.Transport` (held as `Transport.web`; it uses the connection's `connect` and
`name`), plus the response parser.
"""

from __future__ import annotations

import json as jsonlib
import socket
import time
from typing import Any, Callable

from fleetspec.errors import RemoteError, UserError
from fleetspec.remote import limits
from fleetspec.remote.api import HttpResponse
from fleetspec.remote.exchange import CHUNK, close_quietly
from fleetspec.remote.observe import _observe
from fleetspec.remote.ssh_lib import paramiko


def check_headers(name: str, headers: dict[str, str] | None) -> None:
    """A CR/LF in a header value (an API key from the environment) would add headers or a request:
    refused in one line, before anything is sent."""
    for k, v in (headers or {}).items():
        if any(c in f"{k}{v}" for c in "\r\n\0") or not k or ":" in k:
            raise UserError(f"{name}: HTTP header {k!r} holds a CR, LF or NUL (or a bad name); "
                            f"refusing to send it (check the variable it comes from)")


class HttpOverSsh:
    """http() over one connection (`connect` returns its paramiko transport)."""

    def __init__(self, name: str, connect: Callable[[], paramiko.Transport]):
        self.name, self.connect = name, connect

    def http(self, method: str, port: int, path: str, json: Any = None, timeout: float = 5,
             headers: dict[str, str] | None = None) -> HttpResponse:
        """A minimal HTTP/1.1 request to 127.0.0.1:<port> on the host, through a direct-tcpip channel."""
        check_headers(self.name, headers)
        began = time.monotonic()
        what = f"{method.upper()} http://127.0.0.1:{port}{path}"
        try:
            response = self._http_inner(method, port, path, json, timeout, headers)
        except RemoteError as err:
            _observe(self.name, what, began, f"error: {str(err).removeprefix(self.name + ': ')}")
            raise
        _observe(self.name, what, began, f"HTTP {response.status}")
        return response

    def _http_inner(self, method, port, path, json, timeout, headers) -> HttpResponse:
        ssh = self.connect()
        body = b"" if json is None else jsonlib.dumps(json).encode()
        lines = [f"{method.upper()} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
                 "Accept: application/json", "User-Agent: fleetspec"]
        if json is not None:
            lines.append("Content-Type: application/json")
        if body or method.upper() in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        where = f"{self.name}: http://127.0.0.1:{port}{path}"
        try:
            chan = ssh.open_channel("direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as err:
            raise RemoteError(f"{where}: connection refused ({err.text})") from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise RemoteError(f"{where}: {err or 'channel open timed out'}") from None
        deadline = time.monotonic() + timeout
        raw = bytearray()
        try:
            chan.settimeout(timeout)
            chan.sendall(request)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteError(f"{where}: no complete answer within {timeout:g}s")
                chan.settimeout(left)
                chunk = chan.recv(CHUNK)
                if not chunk:
                    break
                raw += chunk
                if len(raw) > limits.HTTP_BODY_MAX + 65536:      # the body, and room for the head
                    raise RemoteError(f"{where}: the answer runs past {limits.size(limits.HTTP_BODY_MAX)}; "
                                      f"fleetspec reads at most that much of one HTTP answer")
        except socket.timeout:
            raise RemoteError(f"{where}: no complete answer within {timeout:g}s") from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise RemoteError(f"{where}: {err}") from None
        finally:
            close_quietly(chan)
        return _parse_http(bytes(raw), where)


def _parse_http(raw: bytes, where: str) -> HttpResponse:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise RemoteError(f"{where}: truncated HTTP answer ({len(raw)} bytes)")
    lines = head.decode("iso-8859-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not (parts[1].isascii() and parts[1].isdigit()):
        raise RemoteError(f"{where}: not an HTTP answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(body, where)
    elif "content-length" in headers:
        length = headers["content-length"]
        if not length.isascii() or not length.isdigit():
            raise RemoteError(f"{where}: Content-Length {length[:40]!r} is not a byte count")
        body = body[: int(length)]
    return HttpResponse(int(parts[1]), headers, body)


def _dechunk(data: bytes, where: str) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.find(b"\r\n", i)
        if j < 0:
            raise RemoteError(f"{where}: truncated chunked body")
        word = data[i:j].split(b";")[0].strip() or b"0"
        if len(word) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in word):
            raise RemoteError(f"{where}: chunk size {word[:40]!r} is not a hex byte count")
        size = int(word, 16)
        if size == 0:
            return bytes(out)
        out += data[j + 2:j + 2 + size]
        i = j + 2 + size + 2

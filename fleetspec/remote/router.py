"""sglang-router's admin API (0.3.2, SGLang Model Gateway): the one place HTTP to a router goes.

The controller reaches the router's admin address directly (a router is a fleet service, not a
host fleetspec logs in to). What 0.3.2 answers (checked against the real binary, DEVELOPING.md):
`GET /workers` -> {"workers": [{"id", "url", "is_healthy", "load", ...}], "total"};
`POST /workers {"url"}` and `DELETE /workers/{id}` -> 202, applied in the background (poll
`/workers`); `GET /get_loads` -> {"workers": [{"worker", "load"}]} (-1 where the worker has no
`/get_load`). The router's per-worker in-flight gauge is `smg_worker_requests_active{worker=url}`
on its Prometheus port.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from fleetspec.errors import RemoteError
from fleetspec.model import hostjson
from fleetspec.remote import limits
from fleetspec.remote.http import _parse_http

T = TypeVar("T")


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    healthy: bool
    load: int


class RouterClient:
    """One request per call, on its own connection (`Connection: close`), read whole within one
    deadline (`timeout`, connect to last byte: an answer that trickles ends there) and at most
    limits.HTTP_BODY_MAX. A redirect is an answer like any other status, never followed: the
    admin key goes only to the admin address the inventory names. Whatever the router answers,
    a malformed answer is a RemoteError."""

    def __init__(self, admin_url: str, api_key: str | None = None, timeout: float = 10.0, name: str = "router"):
        self.base = admin_url.rstrip("/")
        self.api_key, self.timeout, self.name = api_key, timeout, name

    def _request(self, method: str, path: str, data: bytes | None) -> bytes:
        url = urllib.parse.urlsplit(self.base + path)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise RemoteError(f"{self.name}: {self.base} is not an http(s) address")
        port = url.port or (443 if url.scheme == "https" else 80)
        host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        head = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
                "Accept: application/json", "User-Agent: fleetspec"]
        if data is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
        if self.api_key:
            if any(c in self.api_key for c in "\r\n\0"):
                raise RemoteError(f"{self.name}: its API key holds a CR, LF or NUL; refusing to send it")
            head.append(f"Authorization: Bearer {self.api_key}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (data or b"")
        deadline = time.monotonic() + self.timeout
        raw = bytearray()
        sock = socket.create_connection((url.hostname, port), timeout=self.timeout)
        try:
            if url.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=url.hostname)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(request)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout()
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    return bytes(raw)
                raw += chunk
                if len(raw) > limits.HTTP_BODY_MAX + 65536:      # the body, and room for the head
                    raise RemoteError(f"{self.name}: {method} {path}: the answer runs past "
                                      f"{limits.size(limits.HTTP_BODY_MAX)}; fleetspec reads at most that much")
        finally:
            sock.close()

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        where = f"{self.name}: {method} {self.base}{path}"
        try:
            raw = self._request(method, path, data)
        except socket.timeout:
            raise RemoteError(f"{where}: no complete answer within {self.timeout:g}s") from None
        except (OSError, ValueError, UnicodeError) as err:
            raise RemoteError(f"{where} failed: {err}") from None
        answer = _parse_http(raw, where)
        if not answer.body:
            return answer.status, None
        try:
            return answer.status, hostjson.loads(answer.body)
        except ValueError:
            return answer.status, answer.body.decode("utf-8", "replace")

    def _expect(self, method: str, path: str, want: tuple[int, ...], body: Any = None) -> Any:
        status, data = self._call(method, path, body)
        if status not in want:
            raise RemoteError(f"{self.name}: {method} {path} answered HTTP {status}: {_short(data)}")
        return data

    def _read(self, what: str, data: Any, read: Callable[[Any], T]) -> T:
        """`read(data)`, or a RemoteError: an answer of another shape (a list, a string, a load of
        1e999 or "x") must fail the call, not escape as a TypeError, OverflowError or AttributeError."""
        try:
            return read(data)
        except Exception:  # any shape the router sent is one failed request
            raise RemoteError(f"{self.name}: {what}: unexpected answer {_short(data)}") from None

    def workers(self) -> list[Worker]:
        data = self._expect("GET", "/workers", (200,))
        return self._read("GET /workers", data, lambda d: [
            Worker(str(w["id"]), str(w["url"]).rstrip("/"), bool(w.get("is_healthy")), int(w.get("load") or 0))
            for w in d["workers"]])

    def find(self, url: str) -> Worker | None:
        url = url.rstrip("/")
        return next((w for w in self.workers() if w.url == url), None)

    def loads(self) -> dict[str, int]:
        data = self._expect("GET", "/get_loads", (200,))
        return self._read("GET /get_loads", data, lambda d: {
            str(w["worker"]).rstrip("/"): int(w["load"]) for w in (d or {}).get("workers", [])})

    def remove(self, url: str, wait: float = 30.0) -> bool:
        """Queue the removal and wait until /workers no longer lists it; False when it was not listed."""
        worker = self.find(url)
        if worker is None:
            return False
        self._expect("DELETE", "/workers/" + urllib.parse.quote(worker.id, safe=""), (200, 202, 204))
        self._until(lambda: self.find(url) is None, wait, f"still lists {url} after its removal")
        return True

    def add(self, url: str, wait: float = 60.0, healthy: bool = True) -> Worker:
        """Queue the addition (unless listed) and wait until /workers lists it (healthy, by default)."""
        if self.find(url) is None:
            self._expect("POST", "/workers", (200, 201, 202), {"url": url.rstrip("/")})
        self._until(lambda: (w := self.find(url)) is not None and (w.healthy or not healthy), wait,
                    f"does not list {url} {'as healthy ' if healthy else ''}after adding it")
        worker = self.find(url)
        assert worker is not None
        return worker

    def _until(self, done, wait: float, what: str) -> None:
        deadline = time.monotonic() + wait
        while not done():
            if time.monotonic() >= deadline:
                raise RemoteError(f"{self.name}: {self.base} {what} ({wait:.0f} s)")
            time.sleep(0.1)


def _short(data: Any) -> str:
    """At most 200 characters of an answer for a message (hostjson bounds its nesting)."""
    try:
        return str(data)[:200]
    except Exception:  # a message must not fail on what it quotes
        return f"<{type(data).__name__}>"

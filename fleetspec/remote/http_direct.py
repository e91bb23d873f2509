"""HTTP from the controller straight to an endpoint URL (no SSH): `fleetspec gate`'s way to an
SGLang service that is not a host fleetspec logs in to (a Kubernetes Service, a pod's address).

`HttpDirect.http` has `HttpOverSsh.http`'s signature and answer (`api.HttpResponse`), so the gates
(ops/gates.measure, sglang_api.generate) run unchanged over it; the port argument is the URL's
(callers pass `client.port`). The same limits apply: at most `limits.HTTP_BODY_MAX` of one answer,
no CR/LF in a header, and every failure is one RemoteError line naming the URL.
"""

from __future__ import annotations

import http.client
import json as jsonlib
import socket
import ssl
import time
import urllib.parse
from typing import Any

from fleetspec.errors import RemoteError, UserError
from fleetspec.remote import limits
from fleetspec.remote.api import HttpResponse
from fleetspec.remote.http import check_headers
from fleetspec.remote.observe import _observe


def parse_url(url: str, what: str = "URL") -> urllib.parse.SplitResult:
    """An http(s) URL with a host; UserError (exit 2) naming `what` otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port                      # noqa: B018  (raises on a port that is not a number)
    except ValueError as err:
        raise UserError(f"{what} {url!r}: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{what} {url!r}: expected http://HOST[:PORT][/PREFIX] or https://…")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UserError(f"{what} {url!r}: expected no query, fragment or credentials (the API key is "
                        f"--api-key-env's variable)")
    return parts


class HttpDirect:
    """http() to one base URL (`http://svc.ns:30000`, an optional path prefix kept in front)."""

    def __init__(self, url: str, name: str | None = None):
        self.parts = parse_url(url)
        self.url = url.rstrip("/")
        self.name = name or self.url
        self.port = self.parts.port or (443 if self.parts.scheme == "https" else 80)
        self.prefix = self.parts.path.rstrip("/")

    def http(self, method: str, port: int, path: str, json: Any = None, timeout: float = 5,
             headers: dict[str, str] | None = None) -> HttpResponse:
        """One request to `<url><path>` (`port` is the URL's own; a different one is a caller's bug)."""
        if port != self.port:
            raise RemoteError(f"{self.name}: asked for port {port}, the URL's is {self.port}")
        check_headers(self.name, headers)
        began = time.monotonic()
        what = f"{method.upper()} {self.url}{path}"
        try:
            response = self._request(method, path, json, timeout, headers or {})
        except RemoteError as err:
            _observe(self.name, what, began, f"error: {err}")
            raise
        _observe(self.name, what, began, f"HTTP {response.status}")
        return response

    def _request(self, method, path, json, timeout, headers) -> HttpResponse:
        where = f"{self.url}{path}"
        body = None if json is None else jsonlib.dumps(json).encode()
        sent = {"Accept": "application/json", "User-Agent": "fleetspec", "Connection": "close", **headers}
        if body is not None:
            sent["Content-Type"] = "application/json"
        host = self.parts.hostname or ""
        conn = (http.client.HTTPSConnection(host, self.port, timeout=timeout, context=ssl.create_default_context())
                if self.parts.scheme == "https" else http.client.HTTPConnection(host, self.port, timeout=timeout))
        deadline = time.monotonic() + timeout
        try:
            conn.request(method.upper(), self.prefix + path, body=body, headers=sent)
            resp = conn.getresponse()
            raw = bytearray()
            while chunk := resp.read(65536):
                raw += chunk
                if len(raw) > limits.HTTP_BODY_MAX:
                    raise RemoteError(f"{where}: the answer runs past {limits.size(limits.HTTP_BODY_MAX)}; "
                                      f"fleetspec reads at most that much of one HTTP answer")
                if time.monotonic() > deadline:
                    raise RemoteError(f"{where}: no complete answer within {timeout:g}s")
            return HttpResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, bytes(raw))
        except socket.timeout:
            raise RemoteError(f"{where}: no complete answer within {timeout:g}s") from None
        except ConnectionRefusedError:
            raise RemoteError(f"{where}: connection refused") from None
        except (OSError, http.client.HTTPException) as err:
            raise RemoteError(f"{where}: {err or type(err).__name__}") from None
        finally:
            conn.close()

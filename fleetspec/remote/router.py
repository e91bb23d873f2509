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
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from fleetspec.errors import RemoteError


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    healthy: bool
    load: int


class RouterClient:
    def __init__(self, admin_url: str, api_key: str | None = None, timeout: float = 10.0, name: str = "router"):
        self.base = admin_url.rstrip("/")
        self.api_key, self.timeout, self.name = api_key, timeout, name

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("content-type", "application/json")
        if self.api_key:
            req.add_header("authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        except (OSError, ValueError) as err:
            raise RemoteError(f"{self.name}: {method} {self.base}{path} failed: {err}") from None
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def _expect(self, method: str, path: str, want: tuple[int, ...], body: Any = None) -> Any:
        status, data = self._call(method, path, body)
        if status not in want:
            raise RemoteError(f"{self.name}: {method} {path} answered HTTP {status}: {str(data)[:200]}")
        return data

    def workers(self) -> list[Worker]:
        data = self._expect("GET", "/workers", (200,))
        try:
            return [Worker(str(w["id"]), str(w["url"]).rstrip("/"), bool(w.get("is_healthy")),
                           int(w.get("load") or 0)) for w in data["workers"]]
        except (KeyError, TypeError, ValueError):
            raise RemoteError(f"{self.name}: GET /workers: unexpected answer {str(data)[:200]}") from None

    def find(self, url: str) -> Worker | None:
        url = url.rstrip("/")
        return next((w for w in self.workers() if w.url == url), None)

    def loads(self) -> dict[str, int]:
        data = self._expect("GET", "/get_loads", (200,))
        return {str(w["worker"]).rstrip("/"): int(w["load"]) for w in (data or {}).get("workers", [])}

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

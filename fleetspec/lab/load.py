"""A bounded closed-loop load generator for the lab: `clients` threads each send one /generate at
a time to a base URL (a router's, or an engine's) until `seconds` pass, `requests` are sent or
`stop()` is called, whichever comes first; it always stops by itself.

Every answer is kept as (start, seconds, HTTP status or -1 for no answer), so a caller can count
failures and take latency percentiles over any window (before and during a rollout)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

MAX_CLIENTS, MAX_SECONDS, MAX_REQUESTS = 64, 600.0, 200_000


@dataclass(frozen=True)
class Answer:
    at: float            # time.monotonic() when sent
    seconds: float
    status: int          # HTTP status; -1: no answer (refused, reset, timed out)

    @property
    def ok(self) -> bool:
        return self.status == 200


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(answers: list[Answer]) -> dict:
    lat = [a.seconds for a in answers if a.ok]
    p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
    return {"sent": len(answers), "failed": sum(1 for a in answers if not a.ok),
            "p50_s": None if p50 is None else round(p50, 4), "p99_s": None if p99 is None else round(p99, 4)}


class Load:
    def __init__(self, base_url: str, clients: int = 4, seconds: float = 120.0, requests: int = 20_000,
                 max_new_tokens: int = 8, timeout: float = 30.0):
        if not 1 <= clients <= MAX_CLIENTS or not 0 < seconds <= MAX_SECONDS or not 1 <= requests <= MAX_REQUESTS:
            raise ValueError(f"load: clients 1-{MAX_CLIENTS}, seconds up to {MAX_SECONDS:.0f}, "
                             f"requests 1-{MAX_REQUESTS}")
        self.url = base_url.rstrip("/") + "/generate"
        self.body = json.dumps({"text": "lab load", "sampling_params": {"max_new_tokens": max_new_tokens}}).encode()
        self.clients, self.seconds, self.requests, self.timeout = clients, seconds, requests, timeout
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.began = 0.0

    def _one(self) -> Answer:
        began = time.monotonic()
        req = urllib.request.Request(self.url, self.body, {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                r.read()
                status = r.status
        except urllib.error.HTTPError as err:
            status = err.code
        except OSError:
            status = -1
        return Answer(began, time.monotonic() - began, status)

    def _loop(self) -> None:
        deadline = self.began + self.seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            with self._lock:
                if len(self.answers) >= self.requests:
                    return
            answer = self._one()
            with self._lock:
                self.answers.append(answer)

    def start(self) -> "Load":
        self.began = time.monotonic()
        self._threads = [threading.Thread(target=self._loop, name=f"load-{i}", daemon=True)
                         for i in range(self.clients)]
        for th in self._threads:
            th.start()
        return self

    def wait_for(self, n: int, timeout: float = 60.0) -> None:
        """Until `n` answers came back (traffic flows), or raise."""
        deadline = time.monotonic() + timeout
        while len(self.answers) < n:
            if time.monotonic() > deadline or not any(th.is_alive() for th in self._threads):
                raise RuntimeError(f"load: {len(self.answers)} answers from {self.url} after {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> list[Answer]:
        self._stop.set()
        for th in self._threads:
            th.join(self.timeout + 5)
        with self._lock:
            return list(self.answers)

    def __enter__(self) -> "Load":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def window(self, start: float, end: float) -> list[Answer]:
        return [a for a in self.answers if start <= a.at < end]

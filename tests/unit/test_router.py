"""Drain through the real sglang-router 0.3.2, in front of real lab engine stand-ins (the thin
engine: stdlib only, starts in well under a second) on loopback ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from fleetspec.errors import UserError
from fleetspec.model import ledger
from fleetspec.model.router import RouterSpec
from fleetspec.ops import drain
from fleetspec.remote import prometheus
from fleetspec.remote.router import RouterClient
from tests.conftest import free_port

pytest.importorskip("sglang_router")
ENGINE = Path(__file__).resolve().parents[2] / "fleetspec" / "lab" / "engine"


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post(url: str, body: dict, timeout: float = 30.0) -> int:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return -1


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.05)


class Engine:
    def __init__(self, tmp: Path, step_seconds: float = 0.02, faults: dict | None = None, drain_seconds: float = 20):
        self.etc = tmp / f"etc-{id(self)}"
        self.etc.mkdir()
        (self.etc / "engine.json").write_text(json.dumps(
            {"load_seconds": 0, "thin_step_seconds": step_seconds, "drain_seconds": drain_seconds}))
        if faults:
            (self.etc / "faults.json").write_text(json.dumps(faults))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ENGINE), "FLEETSPEC_LAB_ETC": str(self.etc)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetspec_lab_engine.thin", "--model-path", "/models/m", "--host",
             "127.0.0.1", "--port", str(self.port), "--enable-metrics", "--speculative-algorithm", "EAGLE"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: self._ok(), 20, f"engine on {self.port}")

    def _ok(self) -> bool:
        try:
            return _get(self.url + "/health", 1)[0] == 200
        except OSError:
            return False

    def metrics(self) -> str:
        return _get(self.url + "/metrics")[1].decode()

    def in_flight(self) -> int | None:
        return prometheus.in_flight(self.metrics())

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(25)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def engines(tmp_path):
    made: list[Engine] = []
    yield lambda **kw: made.append(Engine(tmp_path, **kw)) or made[-1]
    for e in made:
        if e.proc and e.proc.poll() is None:
            e.proc.kill()
            e.proc.wait()


@pytest.fixture
def router(tmp_path):
    procs: list[subprocess.Popen] = []

    def start(*workers: str) -> RouterClient:
        port, prom = free_port(), free_port()
        log = open(tmp_path / f"router-{port}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
             "--prometheus-port", str(prom), "--health-check-interval-secs", "1", "--policy", "round_robin",
             "--worker-urls", *workers], stdout=log, stderr=subprocess.STDOUT))
        client = RouterClient(f"http://127.0.0.1:{port}")
        _wait(lambda: _listed(client, workers), 30, "router lists its workers healthy")
        return client

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _listed(client: RouterClient, urls) -> bool:
    try:
        return {w.url for w in client.workers() if w.healthy} >= set(urls)
    except Exception:
        return False


def _spec(client: RouterClient, **kw) -> RouterSpec:
    return RouterSpec(name="front", admin_url=client.base, **{"drain_timeout": 10.0, "add_timeout": 20.0, **kw})


def _served(engine: Engine) -> float:
    return prometheus.total(prometheus.parse(engine.metrics()), prometheus.REQUESTS) or 0.0


def test_router_lists_removes_and_stops_routing_to_a_drained_worker(engines, router):
    a, b = engines(), engines()
    client = router(a.url, b.url)
    assert {w.url for w in client.workers()} == {a.url, b.url}
    lines: list[ledger.Entry] = []
    spec = _spec(client)
    out = drain.drain(spec, client, a.url, lines.append, a.in_flight)
    assert out.was_listed and out.left == 0
    assert [w.url for w in client.workers()] == [b.url]
    assert [(e.kind, e.state, e.detail["worker"]) for e in lines] == [("router", "drained", a.url)]
    before = _served(a)
    for _ in range(6):
        assert _post(client.base + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}) == 200
    assert _served(a) == before, "the router still sent the drained worker traffic"
    drain.put_back(spec, client, a.url, lines.append)
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}
    assert lines[-1].state == "restored"
    assert ledger.parse("\n".join(e.to_line() for e in lines)).drained() is None


def test_drain_waits_for_the_request_in_flight(engines, router):
    """Decided on what the drain saw, not on how long it took: the request was in flight at its
    first look, and the drain ended on the engine saying none is left, far inside its own bound."""
    a, b = engines(step_seconds=0.25), engines()      # 10 s in flight: seen whatever else runs here
    client = router(a.url, b.url)
    codes: list[int] = []
    slow = threading.Thread(target=lambda: codes.append(
        _post(a.url + "/generate", {"text": "long", "sampling_params": {"max_new_tokens": 40}}, timeout=300)))
    slow.start()
    _wait(lambda: a.in_flight() == 1, 30, "the request is in flight")
    looks: list[int | None] = []

    def in_flight() -> int | None:
        looks.append(a.in_flight())
        return looks[-1]
    out = drain.drain(_spec(client, drain_timeout=600.0), client, a.url, lambda e: None, in_flight)
    slow.join()
    assert codes == [200] and out.left == 0
    assert looks[0] == 1 and looks[-1] == 0 and looks.count(0) == 1, looks


def test_drain_gives_up_after_its_bound_and_says_what_was_left(engines, router):
    a, b = engines(step_seconds=0.5), engines()       # 20 s in flight
    client = router(a.url, b.url)
    slow = threading.Thread(target=lambda: _post(a.url + "/generate", {"sampling_params": {"max_new_tokens": 40},
                                                                        "text": "x"}))
    slow.start()
    _wait(lambda: a.in_flight() == 1, 30, "the request is in flight")
    out = drain.drain(_spec(client, drain_timeout=0.5), client, a.url, lambda e: None, a.in_flight)
    assert out.left == 1 and 0.5 <= out.waited_s < 15
    slow.join()


def test_min_serving_refuses_before_anything_changes(engines, router):
    a, b = engines(), engines()
    client = router(a.url, b.url)
    with pytest.raises(UserError, match="fewer than min_serving 2"):
        drain.check_min_serving(_spec(client, min_serving=2), client, [a.url])
    drain.check_min_serving(_spec(client, min_serving=1), client, [a.url])
    assert {w.url for w in client.workers()} == {a.url, b.url}


def test_a_drained_worker_left_by_a_killed_command_goes_back(engines, router):
    a, b = engines(), engines()
    client = router(a.url, b.url)
    lines: list[ledger.Entry] = []
    spec = _spec(client)
    drain.drain(spec, client, a.url, lines.append, a.in_flight)
    parsed = ledger.parse("\n".join(e.to_line() for e in lines))
    assert parsed.drained() is not None and parsed.releases() == {}
    assert drain.put_back_pending(parsed, drain.Seat(spec, a.url), client, lines.append).own
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}


def test_no_client_request_fails_while_a_worker_is_drained_and_its_engine_restarted(engines, router):
    a, b = engines(step_seconds=0.01), engines(step_seconds=0.01)
    client = router(a.url, b.url)
    spec = _spec(client)
    codes: list[int] = []
    stop = threading.Event()

    def clients():
        while not stop.is_set():
            codes.append(_post(client.base + "/generate", {"text": "q", "sampling_params": {"max_new_tokens": 8}}))

    loops = [threading.Thread(target=clients) for _ in range(3)]
    for t in loops:
        t.start()
    try:
        _wait(lambda: len(codes) >= 10, 60, "traffic flows")
        out = drain.drain(spec, client, a.url, lambda e: None, a.in_flight)
        assert out.left == 0
        a.stop()
        a.start()
        drain.put_back(spec, client, a.url, lambda e: None)
        served = _served(a)
        _wait(lambda: _served(a) > served, 60, "the restarted worker serves again")
    finally:
        stop.set()
        for t in loops:
            t.join()
    assert len(codes) > 10 and set(codes) == {200}, {c: codes.count(c) for c in set(codes)}


def test_sigterm_drains_in_flight_requests_and_refuses_new_ones(engines):
    # 36 s in flight, well inside its drain bound: the request outlasts the waits below however starved
    # of CPU this run is (nice 19 beside two lab streams)
    a = engines(step_seconds=0.6, drain_seconds=120)
    codes: list[int] = []
    slow = threading.Thread(target=lambda: codes.append(
        _post(a.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 60}}, timeout=150)))
    slow.start()
    _wait(lambda: a.in_flight() == 1, 30, "in flight")
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    _wait(lambda: _get(a.url + "/health")[0] == 503, 30, "health says 503 while draining")
    assert _post(a.url + "/generate", {"text": "y"}) == 503
    slow.join()
    assert codes == [200] and a.proc.wait(10) == 0

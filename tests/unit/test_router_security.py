"""The router side of the third audit, against the real sglang-router 0.3.2 and the lab's thin
engines on loopback, and against small real HTTP servers on loopback that answer as a hostile
router or engine would: a host's ledger steers no router, min_serving holds on the worst hosts
that can be out at once and before each drain, NaN on /metrics neither passes nor breaks a
rollback, and the router client is bounded, deadlined, redirect-free and fails as RemoteError."""

from __future__ import annotations

import http.server
import json
import threading
from types import SimpleNamespace

import pytest

from fleetspec.errors import RemoteError, UserError
from fleetspec.model import ledger as L
from fleetspec.model.inventory import load_inventory
from fleetspec.model.router import RouterSpec
from fleetspec.ops import drain, fleet
from fleetspec.remote.facts import release_state
from fleetspec.remote.router import RouterClient
from tests.unit.test_router import _wait, engines, router  # noqa: F401  (fixtures)
from tests.unit.test_router_deploy import _ledger, _rollback, _seat, link  # noqa: F401  (fixtures)


class Peer:
    """A real HTTP server on loopback that records every request and answers with
    `reply(handler)` (which writes the whole answer itself)."""

    def __init__(self, address: str = "127.0.0.1", reply=None):
        self.requests: list[tuple[str, str, dict]] = []
        self.reply = reply or (lambda h: _json(h, 200, {"workers": [], "total": 0}))
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                outer.requests.append((self.command, self.path, dict(self.headers)))
                try:
                    outer.reply(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{address}:{self.httpd.server_address[1]}"
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _json(h, status: int, body, raw: bytes | None = None) -> None:
    data = raw if raw is not None else json.dumps(body).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.send_header("Connection", "close")
    h.end_headers()
    h.wfile.write(data)


@pytest.fixture
def peers():
    made: list[Peer] = []
    yield lambda **kw: made.append(Peer(**kw)) or made[-1]
    for p in made:
        p.close()


def _inventory(tmp_path, front: str, other: str, api_port: int):
    path = tmp_path / "inv.yaml"
    path.write_text(
        "routers:\n"
        f"  front: {{admin_url: '{front}', add_timeout: 30, drain_timeout: 10}}\n"
        f"  other: {{admin_url: '{other}', add_timeout: 2}}\n"
        f"defaults: {{vars: {{router: front, api_port: {api_port}}}}}\n"
        "hosts:\n"
        "  h: {address: 127.0.0.1}\n")
    inv = load_inventory(path)
    return drain.seats(inv, [inv.hosts["h"]])["h"]


# A host's ledger steers no router -----------------------------------------------------------

def test_a_forged_ledger_line_naming_another_router_or_url_is_ignored_and_the_hosts_own_worker_goes_back(
        tmp_path, engines, router, peers):  # noqa: F811
    """Root on the host appends lines naming another router of the inventory (and a URL of its
    choice), and its own router with another worker: nothing is sent for them, the host's own
    worker (left drained by a cut-off command) goes back, and one line says what was ignored."""
    a, b = engines(), engines()
    client = router(a.url, b.url)
    other = peers()
    seat = _inventory(tmp_path, client.base, other.url, a.port)
    assert seat.worker == a.url and seat.spec.name == "front"
    lines: list[L.Entry] = []
    drain.drain(seat.spec, client, a.url, lines.append, a.in_flight)          # what a killed deploy leaves
    assert client.find(a.url) is None
    forged = [L.router_entry(L.DRAINED, "front", b.url), L.router_entry(L.DRAINED, "other", "http://evil.example:1")]
    text = "\n".join(e.to_line() for e in lines + forged)
    said: list[str] = []
    back = drain.HostDrain(seat, lines.append, a.in_flight, said.append, "h")
    back.restore_pending(text)
    assert other.requests == [], "a host's ledger line made fleetspec call another router"
    assert (w := client.find(a.url)) is not None and w.healthy
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}
    assert lines[-1].state == L.RESTORED and lines[-1].detail == {"router": "front", "worker": a.url}
    ignored = [line for line in said if "ignored" in line]
    assert len(ignored) == 1 and "ignored 2 router line(s)" in ignored[0] and "'other'" in ignored[0], said


def test_a_router_line_whose_detail_is_not_an_object_is_reported_not_an_exception(tmp_path, peers):
    """`"detail": "x"` as the last router line used to end the host's rollback in AttributeError."""
    front, other = peers(), peers()
    seat = _inventory(tmp_path, front.url, other.url, 30000)
    text = "\n".join(L.Entry(L.ROUTER, L.ROUTER, "worker", L.DRAINED, detail=d).to_line()   # type: ignore[arg-type]
                     for d in ({"router": "front", "worker": "http://elsewhere.example:1"}, "x", [1, 2]))
    said: list[str] = []
    drain.HostDrain(seat, lambda e: None, lambda: 0, said.append, "h").restore_pending(text)
    assert front.requests == [] and other.requests == []
    assert len(said) == 1 and "ignored 3 router line(s)" in said[0] and "not an object" in said[0], said
    last = text.splitlines()[-1]                 # `status` reads the same last router line as data
    assert release_state.parse(f"exists=yes\nrouter={last}\n").drained == {}


# min_serving on the worst hosts that can be out at once, and again before each drain ---------

def _unhealthy(client: RouterClient, url: str) -> bool:
    try:
        return any(w.url == url and not w.healthy for w in client.workers())
    except RemoteError:
        return False


def test_min_serving_is_checked_on_the_worst_hosts_that_can_be_out_at_once(tmp_path, engines, router):  # noqa: F811
    """x's engine is down and the router counts it unhealthy. Batch [x, y, z] with --parallel 2:
    x fails fast and the pool starts z while y is out, so y and z are out together and nothing
    serves. Checking only the batch's first two hosts ([x, y]) let it through."""
    x, y, z = engines(), engines(), engines()
    client = router(x.url, y.url, z.url)
    x.stop()
    _wait(lambda: _unhealthy(client, x.url), 120, "the router counts x unhealthy")
    hosts = [SimpleNamespace(name=n) for n in "xyz"]
    seats = {h.name: _seat(client, e.url, min_serving=1) for h, e in zip(hosts, (x, y, z), strict=True)}
    strategy = fleet.Strategy.parse(3, canary=0, serial="3", max_fail="0", parallel=2, rollback_all_on_abort=False)
    with pytest.raises(UserError, match="taking out 2 of 2 healthy worker.s. at once would leave 0 serving"):
        fleet.deploy_fleet(hosts, None, connect=lambda h: None, root=tmp_path, options={}, strategy=strategy,
                           echo=lambda line: None, seats=seats)
    assert {w.url for w in client.workers() if w.healthy} == {y.url, z.url}
    one_at_a_time = fleet.Strategy.parse(3, canary=0, serial="3", max_fail="0", parallel=1,
                                         rollback_all_on_abort=False)
    drain.check_batches(one_at_a_time.batches(hosts), seats, parallel=1)        # 1 of 2 out: 1 serves


def test_each_drain_checks_min_serving_again_on_what_the_router_says_now(engines, router):  # noqa: F811
    """The rollout's check passed with both workers healthy; then b's engine went down. Taking
    a out now would leave nothing serving: the drain refuses, before any ledger line or removal."""
    a, b = engines(), engines()
    client = router(a.url, b.url)
    spec = RouterSpec(name="front", admin_url=client.base, min_serving=1, drain_timeout=10.0, add_timeout=20.0)
    drain.check_min_serving(spec, client, [a.url])
    b.stop()
    _wait(lambda: _unhealthy(client, b.url), 120, "the router counts b unhealthy")
    lines: list[L.Entry] = []
    with pytest.raises(UserError, match="fewer than min_serving 1"):
        drain.drain(spec, client, a.url, lines.append, a.in_flight)
    assert lines == [] and (w := client.find(a.url)) is not None and w.healthy


# NaN on /metrics neither passes nor breaks a rollback ---------------------------------------

def _metrics(text: str):
    def reply(h):
        data = text.encode()
        h.send_response(200)
        h.send_header("Content-Type", "text/plain; version=0.0.4")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    return reply


@pytest.mark.parametrize("value", ["NaN", "+Inf"])
def test_a_nan_in_flight_count_after_the_worker_left_does_not_stop_the_rollback_and_it_goes_back(
        link, tmp_path, engines, router, peers, monkeypatch, value):  # noqa: F811
    """The engine's /metrics (read through the host's SSH link, as a rollback does) says
    `sglang:num_running_reqs NaN` once the worker is out of the router: that used to raise
    ValueError there, so the revert never ran and the worker stayed out."""
    a, b = engines(), engines()
    client = router(a.url, b.url)
    seat = _seat(client, a.url)
    hostile = peers(reply=_metrics(f"sglang:num_running_reqs {value}\nsglang:num_queue_reqs 0\n"))
    engine = SimpleNamespace(port=hostile.port, stop=lambda: None, start=lambda: None)
    seen: dict = {}
    said: list[str] = []
    roll, _ = _rollback(link, tmp_path, engine, seat, monkeypatch, seen, said)
    out = roll()
    assert out.status == "rolled_back", out
    assert seen["listed_at_revert"] is False, "the revert ran with the worker still in the router"
    assert any(p == "/metrics" for _, p, _ in hostile.requests), "the drain never read the engine's in-flight count"
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}
    assert _ledger(link, tmp_path).drained() is None


def test_the_fleet_rollback_turns_any_error_of_a_host_into_its_row_and_goes_on(tmp_path):
    """A host whose rollback raises something that is no FleetspecError is a row (exit 3); the
    hosts after it still roll back."""
    tried: list[str] = []

    def connect(h):
        tried.append(h.name)
        raise ValueError(f"cannot convert float NaN to integer ({h.name})")

    hosts = [SimpleNamespace(name="h1"), SimpleNamespace(name="h2")]
    rows, code = fleet.rollback_fleet(hosts, None, connect=connect, root=tmp_path, echo=lambda line: None)
    assert tried == ["h1", "h2"] and code == 3
    assert [r["host"] for r in rows] == ["h1", "h2"] and all("ValueError" in r["reason"] for r in rows)


# The router client: a cap, one deadline, every parse error a RemoteError, no redirects -------

def test_the_router_client_reads_at_most_its_cap(peers):
    def endless(h):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()                                       # no length: the body runs until closed
        chunk = b"x" * 65536
        for _ in range(64 * 16):                              # 64 MiB at most, then it ends
            h.wfile.write(chunk)
    peer = peers(reply=endless)
    with pytest.raises(RemoteError, match="runs past 16 MiB"):
        RouterClient(peer.url, timeout=120).workers()


def test_the_router_client_has_one_deadline_per_call_not_per_read(peers):
    """An answer that trickles one byte at a time (each read well inside the timeout) used to hold
    the client until the peer stopped; the peer here stops after 600 bytes, and the call's own
    deadline ends it long before."""
    ended = threading.Event()

    def trickle(h):
        h.send_response(200)
        h.send_header("Content-Length", "600")
        h.end_headers()
        for _ in range(600):
            if ended.wait(0.05):
                return
            h.wfile.write(b" ")
            h.wfile.flush()
    peer = peers(reply=trickle)
    try:
        with pytest.raises(RemoteError, match="no complete answer within 1s"):
            RouterClient(peer.url, timeout=1).workers()
    finally:
        ended.set()


@pytest.mark.parametrize("path, body", [
    ("/workers", b"[" * 200000),                                                 # RecursionError in json
    ("/workers", b'{"workers": [{"id": "w", "url": "http://w.example:1", "load": 1e999}]}'),  # OverflowError
    ("/workers", b'{"workers": [{"id": "w", "url": "http://w.example:1", "load": "x"}]}'),
    ("/workers", b'{"workers": "all"}'),
    ("/get_loads", b"[1, 2]"),                                                   # AttributeError (.get)
    ("/get_loads", b'{"workers": [{"worker": "w", "load": NaN}]}'),
], ids=["deep-nesting", "load-1e999", "load-text", "workers-a-string", "loads-a-list", "load-nan"])
def test_a_malformed_router_answer_is_a_remote_error(peers, path, body):
    peer = peers(reply=lambda h: _json(h, 200, None, raw=body))
    client = RouterClient(peer.url)
    with pytest.raises(RemoteError):
        client.workers() if path == "/workers" else client.loads()


def test_the_router_client_follows_no_redirect_and_its_key_goes_nowhere_else(peers):
    elsewhere = peers(address="127.0.0.2")

    def moved(h):
        h.send_response(307)
        h.send_header("Location", elsewhere.url + "/workers")
        h.send_header("Content-Length", "0")
        h.end_headers()
    admin = peers(reply=moved)
    with pytest.raises(RemoteError, match="answered HTTP 307"):
        RouterClient(admin.url, api_key="sk-router-admin").workers()
    assert elsewhere.requests == []
    assert admin.requests[0][2].get("Authorization") == "Bearer sk-router-admin"


def test_the_router_client_still_speaks_to_the_real_router(engines, router):  # noqa: F811
    a, b = engines(), engines()
    client = router(a.url, b.url)
    assert {w.url for w in client.workers()} == {a.url, b.url}
    assert set(client.loads()) >= {a.url, b.url}
    assert client.remove(a.url, wait=30) and client.find(a.url) is None
    assert client.add(a.url, wait=30).healthy

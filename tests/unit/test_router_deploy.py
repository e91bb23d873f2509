"""A deploy behind the real sglang-router 0.3.2: the host's worker leaves the router before the
switch and comes back healthy after commit or after the revert; a removal a killed command left is
shown by status and put back by the next deploy; min_serving refuses a rollout before anything
changes; `rollback` puts back a removal a killed command left and restarts the engine out of
the router. The router, the engines (the lab's thin stand-in), the ssh link and the ledger are real;
the deploy's own steps are stood in for (the lab drives them for real)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import PurePosixPath
from types import SimpleNamespace

import pytest

from fleetspec.errors import UserError
from fleetspec.model import ledger as L
from fleetspec.model.bake import BakeSpec
from fleetspec.model.baseline import Baseline
from fleetspec.model.inventory import load_inventory
from fleetspec.model.layout import HostLayout
from fleetspec.model.playbook import Smoke
from fleetspec.model.router import RouterSpec
from fleetspec.ops import activation, drain, fleet, gpu_checks, history, probes
from fleetspec.ops.deploy import Deploy, DeployRequest, StepFailed
from fleetspec.remote.facts import release_state
from fleetspec.remote.transport import Transport
from tests.unit.test_router import _post, _wait, engines, router  # noqa: F401  (fixtures)

pytest.importorskip("sglang_router")
UNIT = b"[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server\n"


@pytest.fixture
def link(sshd, ssh_client_key, inventory_writer, tmp_path):
    inv = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key))
    t = Transport(inv.hosts["h"])
    yield t
    t.close()


class Load:
    """Closed-loop clients to the router: every answer's HTTP status is kept."""

    def __init__(self, base: str, clients: int = 3):
        self.codes: list[int] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(base,)) for _ in range(clients)]

    def _loop(self, base: str) -> None:
        while not self.stop.is_set():
            self.codes.append(_post(base + "/generate", {"text": "q", "sampling_params": {"max_new_tokens": 8}}))

    def __enter__(self) -> "Load":
        for th in self.threads:
            th.start()
        _wait(lambda: len(self.codes) >= 10, 60, "traffic flows")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for th in self.threads:
            th.join()


def _seat(client, url: str, **kw) -> drain.Seat:
    spec = RouterSpec(name="front", admin_url=client.base, **{"drain_timeout": 10.0, "add_timeout": 30.0, **kw})
    return drain.Seat(spec, url)


def _deploy(link, tmp_path, engine, seat, monkeypatch, *, probes_ok: bool = True, seen: dict | None = None,
            bake=None, release_faults: dict | None = None):
    """A Deploy on the loopback host whose engine is `engine`; switch and restart restart it."""
    host = dataclasses.replace(link.host, vars=dataclasses.replace(link.host.vars, api_port=engine.port))
    pf = SimpleNamespace(staged_ahead=None, container_facts=None, unit_bytes=UNIT, dropins={}, redact=lambda text: text,
                         summary=lambda: {}, baseline=None, playbook=None, gpu_health=None)
    playbook = SimpleNamespace(algo="ddtree", smoke=Smoke(), bake=bake)
    d = Deploy(link, DeployRequest(host=host, playbook=playbook, root=tmp_path, seat=seat), pf, echo=lambda line: None)
    d.state.layout = HostLayout("svc.service", root=PurePosixPath(str(tmp_path / "state")))
    client = drain.client_for(seat.spec)
    seen = seen if seen is not None else {}

    def switch():
        seen["listed_at_switch"] = client.find(seat.worker) is not None
        d.switched = True
        return {}

    def restart():
        engine.stop()
        if release_faults:
            (engine.etc / "faults.json").write_text(json.dumps(release_faults))
        engine.start()
        return {}

    def check():
        if not probes_ok:
            raise StepFailed("probes", "stood in: the release does not answer")
        return {}

    def commit():
        d.prune_old = []
        return {}

    def baseline():
        pf.baseline = Baseline(service="svc.service", unit_path="/etc/systemd/system/svc.service", unit_bytes=UNIT,
                               dropins={}, exec_argv=[], environment={}, sglang={}, served_algorithm=None,
                               declared_algorithm=None, taken_at=time.time())
        return {}

    def revert_to(*a, **k):
        seen["listed_at_revert"] = client.find(seat.worker) is not None
        engine.stop()
        (engine.etc / "faults.json").unlink(missing_ok=True)
        engine.start()
        return probes.ProbeResult(True, "generate")

    monkeypatch.setattr(activation, "revert_to", revert_to)
    monkeypatch.setattr(gpu_checks, "cause_since", lambda *a: [])
    d.work = {name: (lambda: {}) for name in d.work}
    d.work.update(baseline=baseline, switch=switch, restart=restart, probes=check, commit=commit)
    return d


def _ledger(link, tmp_path) -> L.ParsedLedger:
    return L.parse(link.run_script(f"cat {tmp_path}/state/svc/ledger.jsonl", timeout=10, check=True).stdout)


def test_a_deploy_takes_its_worker_out_before_the_switch_and_back_after_commit(
        link, tmp_path, engines, router, monkeypatch):  # noqa: F811
    a, b = engines(step_seconds=0.01), engines(step_seconds=0.01)
    client = router(a.url, b.url)
    seen: dict = {}
    d = _deploy(link, tmp_path, a, _seat(client, a.url), monkeypatch, seen=seen)
    with Load(client.base) as load:
        out = d.run()
        served = len(load.codes)
        _wait(lambda: len(load.codes) > served + 5, 30, "traffic goes on")
    assert out.status == "healthy", out.reason
    assert seen["listed_at_switch"] is False
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}
    assert set(load.codes) == {200}, {c: load.codes.count(c) for c in set(load.codes)}
    assert out.router["worker"] == a.url and out.router["out_s"] > 0
    states = [e.state for e in _ledger(link, tmp_path).entries if e.kind == L.ROUTER]
    assert states == ["drained", "restored"]


def test_a_failed_release_is_reverted_then_put_back_with_no_failed_request(
        link, tmp_path, engines, router, monkeypatch):  # noqa: F811
    a, b = engines(step_seconds=0.01), engines(step_seconds=0.01)
    client = router(a.url, b.url)
    seen: dict = {}
    d = _deploy(link, tmp_path, a, _seat(client, a.url), monkeypatch, probes_ok=False, seen=seen)
    with Load(client.base) as load:
        out = d.run()
    assert out.status == "rolled_back" and out.exit_code == 1
    assert seen["listed_at_revert"] is False, "the revert restarted the engine while the router still sent to it"
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}
    assert set(load.codes) == {200}, {c: load.codes.count(c) for c in set(load.codes)}
    assert _ledger(link, tmp_path).drained() is None


def test_a_worker_a_killed_command_left_out_is_shown_and_the_next_deploy_puts_it_back(
        link, tmp_path, engines, router, monkeypatch):  # noqa: F811
    a, b = engines(), engines()
    client = router(a.url, b.url)
    seat = _seat(client, a.url)
    d = _deploy(link, tmp_path, a, seat, monkeypatch)
    drain.drain(seat.spec, client, a.url, d.state.record, a.in_flight)       # what a killed deploy leaves
    assert client.find(a.url) is None
    st = release_state.parse(link.run_script(release_state.command("svc.service").replace(
        "/var/lib/fleetspec", f"{tmp_path}/state"), timeout=10).stdout)
    assert st.drained == {"router": "front", "worker": a.url}

    def stage():
        raise StepFailed("stage", "stopped here by the test")
    d.work["stage"] = stage
    out = d.run()
    assert out.failed_step == "stage"
    assert client.find(a.url) is not None and client.find(a.url).healthy
    assert _ledger(link, tmp_path).drained() is None


def test_a_rollout_that_would_leave_too_few_workers_is_refused_before_anything_changes(
        link, engines, router, tmp_path):  # noqa: F811
    a, b = engines(), engines()
    client = router(a.url, b.url)
    hosts = [SimpleNamespace(name="x"), SimpleNamespace(name="y")]
    seats = {"x": _seat(client, a.url, min_serving=1), "y": _seat(client, b.url, min_serving=1)}
    strategy = fleet.Strategy.parse(2, canary=0, serial="2", max_fail="0", parallel=0, rollback_all_on_abort=False)
    with pytest.raises(UserError, match="fewer than min_serving 1"):
        fleet.deploy_fleet(hosts, None, connect=lambda h: None, root=tmp_path, options={}, strategy=strategy,
                           echo=lambda line: None, seats=seats)
    assert {w.url for w in client.workers()} == {a.url, b.url}


BAKE = BakeSpec(duration=6.0, interval=0.5, max_error_rate=0.05, min_accept_ratio=0.9, max_p99_ratio=None,
                min_requests=5)


def test_a_release_that_bakes_well_stays_and_its_figures_are_in_the_outcome_and_history(
        link, tmp_path, engines, router, monkeypatch):  # noqa: F811
    a, b = engines(step_seconds=0.01), engines(step_seconds=0.01)
    client = router(a.url, b.url)
    d = _deploy(link, tmp_path, a, _seat(client, a.url), monkeypatch, bake=BAKE)
    with Load(client.base):
        out = d.run()
    assert out.status == "healthy", out.reason
    bake = out.figures["bake"]
    assert bake["outcome"] == "pass" and bake["release_requests"] >= 5 and bake["release_error_rate"] == 0
    assert bake["release_accept_length"] == bake["baseline_accept_length"] == 2.0
    rel = history.releases(_ledger(link, tmp_path))[-1]
    assert any(line.startswith("bake pass:") for line in history.headline(rel.figures))
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}


def test_a_release_that_degrades_after_commit_is_caught_by_the_bake_and_reverted(
        link, tmp_path, engines, router, monkeypatch):  # noqa: F811
    """The release fails every request after its 10th (the lab engine's fault): the bake sees the
    aborted requests on the engine's own /metrics, the host is reverted and back in the router."""
    a, b = engines(step_seconds=0.01), engines(step_seconds=0.01)
    client = router(a.url, b.url)
    d = _deploy(link, tmp_path, a, _seat(client, a.url), monkeypatch, bake=BAKE,
                release_faults={"fail_requests_after": 10})
    with Load(client.base):
        out = d.run()
    assert out.status == "rolled_back" and out.failed_step == "bake" and out.exit_code == 1, out.reason
    assert "max_error_rate" in out.reason and out.figures["bake"]["outcome"] == "fail"
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}
    assert not (a.etc / "faults.json").exists(), "the revert did not run"
    parsed = _ledger(link, tmp_path)
    assert parsed.drained() is None
    assert parsed.releases()[d.release_id] == "rolled_back"


def _rollback(link, tmp_path, engine, seat, monkeypatch, seen: dict, lines: list[str]):
    """ops.rollback.rollback on the loopback host whose engine is `engine`, from a baseline whose
    unit file is a real file there; the revert restarts the engine."""
    from fleetspec.ops import rollback as rollback_op
    from fleetspec.ops.hoststate import HostState

    host = dataclasses.replace(link.host, vars=dataclasses.replace(link.host.vars, api_port=engine.port,
                                                                   service="svc.service"))
    monkeypatch.setattr(rollback_op, "HostState",
                        lambda *a, **k: HostState(*a, **k, root=PurePosixPath(str(tmp_path / "state"))))
    unit = tmp_path / "svc.service"
    unit.write_bytes(UNIT)
    state = HostState(link, host.name, "svc.service", root=PurePosixPath(str(tmp_path / "state")))
    state.write_baseline(Baseline(service="svc.service", unit_path=str(unit), unit_bytes=UNIT, dropins={},
                                  exec_argv=[], environment={}, sglang={}, served_algorithm=None,
                                  declared_algorithm=None, taken_at=time.time()))
    client = drain.client_for(seat.spec)

    def revert_to(*a, **k):
        seen["listed_at_revert"] = client.find(seat.worker) is not None
        engine.stop()
        engine.start()
        return probes.ProbeResult(True, "generate")

    monkeypatch.setattr(activation, "revert_to", revert_to)
    return lambda: rollback_op.rollback(link, host, tmp_path, seat=seat, echo=lines.append), state


def test_rollback_puts_back_a_worker_a_killed_command_left_out_and_restarts_the_engine_out_of_the_router(
        link, tmp_path, engines, router, monkeypatch):  # noqa: F811
    a, b = engines(step_seconds=0.01), engines(step_seconds=0.01)
    client = router(a.url, b.url)
    seat = _seat(client, a.url)
    seen: dict = {}
    said: list[str] = []
    roll, state = _rollback(link, tmp_path, a, seat, monkeypatch, seen, said)
    drain.drain(seat.spec, client, a.url, state.record, a.in_flight)       # what a killed deploy leaves
    assert client.find(a.url) is None and _ledger(link, tmp_path).drained() is not None
    with Load(client.base) as load:
        out = roll()
    assert out.status == "rolled_back" and out.target == "baseline", out
    assert any(f"put {a.url} back into its router" in line for line in said), said
    assert seen["listed_at_revert"] is False, "the engine restarted while the router still sent to it"
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}
    assert set(load.codes) == {200}, {c: load.codes.count(c) for c in set(load.codes)}
    parsed = _ledger(link, tmp_path)
    assert parsed.drained() is None
    assert [e.state for e in parsed.entries if e.kind == L.ROUTER] == ["drained", "restored", "drained", "restored"]


def test_a_rollback_that_would_leave_too_few_workers_restarts_in_the_router_instead_of_refusing(
        link, tmp_path, engines, router, monkeypatch):  # noqa: F811
    """A rollback runs while a bad release serves: min_serving keeps the worker listed, never stops it."""
    a, b = engines(), engines()
    client = router(a.url, b.url)
    seen: dict = {}
    said: list[str] = []
    roll, _ = _rollback(link, tmp_path, a, _seat(client, a.url, min_serving=2), monkeypatch, seen, said)
    out = roll()
    assert out.status == "rolled_back"
    assert seen["listed_at_revert"] is True
    assert any("stays in the router while it restarts" in line for line in said), said
    assert {w.url for w in client.workers() if w.healthy} == {a.url, b.url}
    assert not [e for e in _ledger(link, tmp_path).entries if e.kind == L.ROUTER]

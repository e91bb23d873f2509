"""`--rollback-all-on-abort` returns each host to where this run found it (issue 13, item 9)."""

from __future__ import annotations

import json
import time
from pathlib import PurePosixPath
from types import SimpleNamespace

import pytest

from fleetspec.model.baseline import Baseline
from fleetspec.model.inventory import load_inventory
from fleetspec.model.layout import HostLayout
from fleetspec.model.playbook import Smoke
from fleetspec.ops import fleet
from fleetspec.ops.deploy import Deploy, DeployOutcome, DeployRequest, StepFailed
from fleetspec.remote.transport import Transport


def test_an_aborted_rollout_returns_each_moved_host_to_its_own_previous_state(monkeypatch, tmp_path):
    """a was on release R-a-old, b on its baseline; c fails and aborts the rollout: a goes back to
    R-a-old (not to its baseline), b to its baseline. The fleet's choice is what is tested; the
    deploys and rollbacks themselves are stood in for (their own tests drive them for real)."""
    hosts = [SimpleNamespace(name=n) for n in ("a", "b", "c")]
    results = {"a": DeployOutcome("a", "healthy", "R-a-new", previous="R-a-old"),
               "b": DeployOutcome("b", "healthy", "R-b-new", previous="baseline"),
               "c": DeployOutcome("c", "rolled_back", "R-c-new", failed_step="probes", exit_code=1,
                                  previous="R-c-old")}
    monkeypatch.setattr(fleet, "deploy_one", lambda h, *a, **k: results[h.name])
    went = {}
    monkeypatch.setattr("fleetspec.ops.rollback.rollback",
                        lambda t, h, root, to, **k: went.setdefault(h.name, to))
    strategy = fleet.Strategy.parse(3, canary=0, serial="3", max_fail="0", parallel=0, rollback_all_on_abort=True)
    out = {o.host: o for o in fleet.deploy_fleet(hosts, None, connect=lambda h: None, root=tmp_path, options={},
                                                  strategy=strategy, echo=lambda line: None)}
    assert went == {"a": "R-a-old", "b": None}            # c reverted itself; it is not touched again
    assert out["a"].status == "rolled_back" and "R-a-old" in out["a"].reason
    assert out["b"].status == "rolled_back" and "baseline" in out["b"].reason


@pytest.fixture
def t(sshd, ssh_client_key, inventory_writer, tmp_path):
    inv = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key))
    t = Transport(inv.hosts["h"])
    yield t
    t.close()


def test_a_deploy_outcome_names_the_release_the_host_was_on(t, tmp_path, monkeypatch):
    """What the fleet returns to comes from the host: `current` as the locked baseline step read it."""

    unit = b"[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server\n"
    pf = SimpleNamespace(staged_ahead=None, container_facts=None, unit_bytes=unit, dropins={}, redact=lambda text: text, summary=lambda: {}, baseline=None,
                         playbook=None)

    def stage(self):
        raise StepFailed("stage", "stopped here by the test")
    monkeypatch.setattr(Deploy, "_stage", stage)
    host = t.host
    d = Deploy(t, DeployRequest(host=host, playbook=SimpleNamespace(algo="ddtree", smoke=Smoke()), root=tmp_path),
               pf, echo=lambda line: None)
    d.state.layout = HostLayout("svc.service", root=PurePosixPath(str(tmp_path / "state")))
    d.state.write_baseline(Baseline(service="svc.service", unit_path="/etc/systemd/system/svc.service",
                                    unit_bytes=unit, dropins={}, exec_argv=[], environment={}, sglang={},
                                    served_algorithm=None, declared_algorithm=None, taken_at=time.time()))
    release = d.state.layout.release("20990101T000000Z-ddtree-old")
    t.run_script(f"mkdir -p {release} && ln -sfn {release} {d.state.layout.current}", timeout=10, check=True)
    out = d.run()
    assert out.failed_step == "stage" and out.previous == "20990101T000000Z-ddtree-old"


def test_rollback_of_several_hosts_goes_on_past_one_that_fails(tmp_path, ssh_client_key):
    """ops.fleet.rollback_fleet, through the real CLI and real connections: a host that cannot be
    reached is a row of its own with its error, the next host is still tried, and the exit code is
    the worst host's."""
    from click.testing import CliRunner

    from fleetspec.cli import main
    from tests.conftest import free_port

    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    (tmp_path / "inventory" / "lab.yaml").write_text(
        "defaults: {ssh_key: %s, known_hosts: /dev/null, connect_timeout: 1}\n"
        "hosts:\n  a: {address: 127.0.0.1, port: %d}\n  b: {address: 127.0.0.1, port: %d}\n"
        % (ssh_client_key, free_port(), free_port()))
    r = CliRunner().invoke(main, ["--root", str(tmp_path), "rollback", "a", "b", "--json"])
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.exit_code == 4 and [(row["host"], row["status"]) for row in rows] == [("a", "error"), ("b", "error")]
    assert all("cannot reach 127.0.0.1" in row["reason"] for row in rows)
    plain = CliRunner().invoke(main, ["--root", str(tmp_path), "rollback", "a", "b"])
    assert plain.exit_code == 4 and plain.stderr.count("fleetspec: a: cannot reach") == 1
    assert plain.stderr.count("fleetspec: b: cannot reach") == 1

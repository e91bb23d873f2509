"""`fleetspec status` against a fleet of real sshds on loopback, one of them stopped."""

import json
import threading

import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.model.inventory import load_inventory
from fleetspec.ops.status import fleet_status
from fleetspec.remote.transport import TransportPool
from tests.conftest import free_port


@pytest.fixture(scope="module")
def fleet(sshd_factory, tmp_path_factory, ssh_client_key, inventory_writer, fake_sglang):
    a, b, c = sshd_factory(), sshd_factory(), sshd_factory()
    root = tmp_path_factory.mktemp("root")
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir()
    inv = inventory_writer(root / "inventory" / "lab.yaml", {"a": a, "b": b, "c": c}, ssh_client_key,
                           connect_timeout=2, host_vars={"a": f"{{api_port: {fake_sglang}}}",
                                                         "b": f"{{api_port: {free_port()}}}"})
    c.stop()
    yield root, inv
    c.start()


class _AllAtOnce:
    """The pool, whose get() returns only once every host has asked for its transport: a
    fleet_status that queried the hosts one after another would never get past it (the
    parallelism shown by an event, not by a bound on the seconds)."""

    def __init__(self, pool, hosts: int):
        self.pool, self.barrier = pool, threading.Barrier(hosts, timeout=120)

    def get(self, host):
        self.barrier.wait()
        return self.pool.get(host)


def test_fleet_status_rows(fleet):
    root, inv_path = fleet
    hosts = load_inventory(inv_path).select([], all_hosts=True)
    with TransportPool() as pool:
        rows = fleet_status(_AllAtOnce(pool, len(hosts)), hosts)     # in parallel: the dead host holds up no other
    a, b, c = rows
    assert [r.host for r in rows] == ["a", "b", "c"]
    assert a.reachable and b.reachable and not c.reachable
    assert "cannot reach 127.0.0.1" in c.error
    assert a.health == "ok" and a.algo == "NEXTN" and a.served_algo == "EAGLE"
    assert b.health == "down" and b.algo is None
    # No systemd and no sglang on this machine: reported, not raised.
    assert a.state == "unknown" and a.sglang == "not installed" and a.release is None


def test_status_cli_json(fleet):
    root, inv_path = fleet
    result = CliRunner().invoke(main, ["--root", str(root), "status", "--all", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [(d["host"], d["reachable"]) for d in lines] == [("a", True), ("b", True), ("c", False)]
    assert lines[0]["algo"] == "NEXTN" and lines[2]["error"]


def test_status_cli_table_and_selection(fleet):
    root, inv_path = fleet
    result = CliRunner().invoke(main, ["--root", str(root), "-i", "lab", "status", "a", "c"])
    assert result.exit_code == 0, result.output
    assert "NEXTN" in result.output and "unreachable" in result.output and " b " not in result.output
    result = CliRunner().invoke(main, ["--root", str(root), "status", "nope"])
    assert result.exit_code == 2 and "unknown host 'nope'" in result.output

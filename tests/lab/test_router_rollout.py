"""Rolling out behind the real sglang-router 0.3.2 (on the controller's 127.0.0.1, in front of the
thin lab hosts' engines) under a bounded closed-loop load: no client request fails, and a worker
left out by a killed fleetspec is shown by `status` and put back by the next command."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from fleetspec.lab.load import Load, summary
from fleetspec.lab.router import LabRouter, router_inventory
from tests.lab.labtools import fs, json_rows

pytestmark = [pytest.mark.lab]
pytest.importorskip("sglang_router")


@pytest.fixture(scope="module")
def routed(thin_fleet, tmp_path_factory):
    hosts = list(thin_fleet.hosts)
    for h in hosts:               # on their baselines, no faults (a kept lab may hold an earlier run's state)
        fs(thin_fleet, "lab", "fault", h, "--clear", check_rc=0)
        if thin_fleet.run(h, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode == 0:
            fs(thin_fleet, "rollback", h, check_rc=0)
    workers = {h: f"http://{thin_fleet.addresses[h]}:30000" for h in hosts}
    router = LabRouter(list(workers.values()), tmp_path_factory.mktemp("router") / "router.log").start()
    inv = router_inventory(thin_fleet.inventory, hosts, router.url, f"lab-router-{os.getpid()}.yaml",
                           min_serving=1, drain_timeout=30, add_timeout=60)
    try:
        yield SimpleNamespace(fleet=thin_fleet, router=router, inv=str(inv), hosts=hosts, workers=workers)
    finally:
        inv.unlink(missing_ok=True)
        router.stop()


def run(r, *args, **kw):
    return fs(r.fleet, "-i", r.inv, *args, **kw)


def test_a_rolling_deploy_behind_the_router_fails_no_client_request(routed):
    a, b = routed.hosts[:2]
    with Load(routed.router.url, clients=4, seconds=120, max_new_tokens=8) as load:
        load.wait_for(20)
        began = time.monotonic()
        out = run(routed, "deploy", a, b, "--algo", "ddtree", "--serial", "1", "--yes", "--no-gates", "--json",
                  timeout=150)
        seen = len(load.answers)
        load.wait_for(seen + 10)
    answers = load.answers
    rows = json_rows(out.stdout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert [r["status"] for r in rows] == ["healthy", "healthy"], rows
    assert all(r["router"]["worker"] == routed.workers[r["host"]] and r["router"]["out_s"] > 0 for r in rows), rows
    during = summary([x for x in answers if x.at >= began])
    assert during["sent"] >= 20 and summary(answers)["failed"] == 0, (summary(answers), during)
    assert routed.router.all_healthy()


def test_a_killed_fleetspec_leaves_its_worker_drained_and_the_next_command_puts_it_back(routed):
    host = routed.hosts[2]
    worker = routed.workers[host]
    cmd = [sys.executable, "-m", "fleetspec", "--root", str(routed.fleet.root), "-i", routed.inv, "deploy", host,
           "--algo", "ddtree", "--yes", "--no-gates"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "FLEETSPEC_PAUSE_AT": "switch"})
    try:
        deadline, said = time.monotonic() + 90, ""
        while "FLEETSPEC-PAUSED switch" not in said:
            assert proc.poll() is None and time.monotonic() < deadline, said
            if select.select([proc.stdout], [], [], 1)[0]:
                said += proc.stdout.readline()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert routed.router.client.find(worker) is None, "paused before the switch, the worker should be out"
    [row] = json_rows(run(routed, "status", host, "--json").stdout)
    assert row["drained"] == {"router": "front", "worker": worker}, row
    shown = run(routed, "status", host).stdout
    assert f"drained: {worker} is out of router front" in shown, shown
    back = run(routed, "rollback", host, timeout=120)
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
    assert routed.router.all_healthy()
    [row] = json_rows(run(routed, "status", host, "--json").stdout)
    assert row["drained"] is None, row


def test_a_failed_canary_under_load_is_reverted_and_back_with_no_failed_request(routed):
    """The canary's new release crashes at start (the fault bites only DDTREE): the host is
    reverted to its baseline, proved healthy and back in the router; the rollout stops there."""
    canary, other = routed.hosts[0], routed.hosts[2]      # the canary is the first in inventory order
    run(routed, "rollback", canary, check_rc=0)            # back on its baseline, which the fault spares
    fs(routed.fleet, "lab", "fault", canary, "crash_at_start", "only_algorithm=DDTREE", check_rc=0)
    try:
        with Load(routed.router.url, clients=4, seconds=120, max_new_tokens=8) as load:
            load.wait_for(20)
            out = run(routed, "deploy", canary, other, "--algo", "ddtree", "--canary", "1", "--max-fail", "0",
                      "--yes", "--no-gates", "--json", timeout=150)
    finally:
        fs(routed.fleet, "lab", "fault", canary, "--clear", check_rc=0)
    rows = {r["host"]: r for r in json_rows(out.stdout)}
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert rows[canary]["status"] == "rolled_back" and rows[canary]["router"]["out_s"] > 0, rows
    assert rows[other]["status"] == "skipped", rows
    assert summary(load.answers)["failed"] == 0, summary(load.answers)
    assert routed.router.all_healthy()

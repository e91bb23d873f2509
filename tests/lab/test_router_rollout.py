"""Rolling out behind the real sglang-router 0.3.2 (on the controller's 127.0.0.1, in front of the
thin lab hosts' engines) under a bounded closed-loop load: no client request fails, a worker
left out by a killed fleetspec is shown by `status` and put back by the next command, and a
release that degrades after commit is caught by the bake, reverted, and the rollout stopped."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
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
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "FLEETSPEC_PAUSE_AT": "switch"})
    try:
        deadline, said = time.monotonic() + 90, ""
        while "FLEETSPEC-PAUSED switch" not in said:
            assert proc.poll() is None and time.monotonic() < deadline, said
            if select.select([proc.stdout], [], [], 1)[0]:      # the fd, unbuffered: readline() could keep
                said += os.read(proc.stdout.fileno(), 65536).decode(errors="replace")  # the last line unseen
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


# sglang-router 0.3.2's circuit breaker sends a worker nothing more after 10 failures: the release
# fails only after FAIL_AFTER requests (~4 s at the stand-in's rate), so those failures come after
# the bake's first scrape of the release, whose own traffic before it is a second or two.
FAIL_AFTER = 60
BAKE = "bake: {duration: 20, interval: 0.5, max_error_rate: 0.01, min_requests: 5}\n"


def baking_root(r, folder: Path) -> Path:
    """A fleet root beside the lab's: the router inventory, the same templates and playbooks, except
    that ddtree's watches the release after commit (a short `bake:`)."""
    src = r.fleet.root
    for name in ("inventory", "playbooks"):
        (folder / name).mkdir()
    (folder / "templates").symlink_to(src / "templates")
    (folder / ".lab").symlink_to(src / ".lab")            # the inventory's keys are ../.lab/ssh/…
    (folder / "inventory" / "lab.yaml").write_bytes(Path(r.inv).read_bytes())
    for p in (src / "playbooks").iterdir():
        if p.name != "ddtree.yaml":
            (folder / "playbooks" / p.name).symlink_to(p)
    (folder / "playbooks" / "ddtree.yaml").write_text((src / "playbooks" / "ddtree.yaml").read_text() + BAKE)
    return folder


def test_a_release_that_degrades_after_commit_is_caught_by_the_bake_reverted_and_the_rollout_stopped(
        routed, tmp_path):
    """The new release answers its probes, then fails every request after its FAIL_AFTER-th (the
    fault bites only DDTREE): the first host's bake sees the errors on the engine's own /metrics, the host goes
    back to its baseline, healthy and in the router, and the second host is never touched."""
    first, second = routed.hosts[0], routed.hosts[2]
    for h in (first, second):      # on their baselines (which the fault spares) and in the router
        if (routed.fleet.run(h, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode == 0
                or routed.router.client.find(routed.workers[h]) is None):
            run(routed, "rollback", h, check_rc=0)
    untouched = "sha256sum /etc/systemd/system/sglang-qwen.service; ls -R /etc/systemd/system/sglang-qwen.service.d " \
                "2>/dev/null; readlink /var/lib/fleetspec/sglang-qwen/current; systemctl show -p ActiveEnterTimestamp " \
                "sglang-qwen"
    before = routed.fleet.run(second, untouched).stdout
    root = baking_root(routed, tmp_path)
    fs(routed.fleet, "lab", "fault", first, f"fail_requests_after={FAIL_AFTER}", "only_algorithm=DDTREE", check_rc=0)
    try:
        with Load(routed.router.url, clients=4, seconds=90, max_new_tokens=8) as load:
            load.wait_for(20)
            out = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), "-i",
                                  str(root / "inventory" / "lab.yaml"), "deploy", first, second, "--algo", "ddtree",
                                  "--serial", "1", "--max-fail", "0", "--yes", "--no-gates", "--json"],
                                 capture_output=True, text=True, timeout=150)
    finally:
        fs(routed.fleet, "lab", "fault", first, "--clear", check_rc=0)
    rows = {r["host"]: r for r in json_rows(out.stdout)}
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    row = rows[first]
    print(f"bake (stand-in engine figures): {row['figures'].get('bake')}; steps {row['step_seconds']}; "
          f"clients {summary(load.answers)}")
    assert row["status"] == "rolled_back" and row["failed_step"] == "bake", row
    bake = row["figures"]["bake"]
    assert bake["outcome"] == "fail" and bake["release_error_rate"] > 0.01 and "max_error_rate" in row["reason"], bake
    assert rows[second]["status"] == "skipped", rows
    assert routed.fleet.run(first, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode != 0
    assert routed.fleet.run(second, untouched).stdout == before
    assert routed.router.all_healthy()
    assert routed.router.client.find(routed.workers[first]).healthy
    shown = run(routed, "history", first, env={"COLUMNS": "250"}).stdout
    assert "bake fail:" in shown, shown

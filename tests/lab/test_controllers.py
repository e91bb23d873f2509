"""Two controllers at once on one fleet (issue 17, scale): disjoint groups do not interfere, and a
host named by both is refused by the second through the host's own lock, with no change made.

The two controllers are two fleetspec processes on one fleet root with different controller ids,
as two operators (or two CI jobs on one runner) deploy shards of one fleet repo: the per-host
ledgers and locks live on the hosts, and the root's local mirror is per host, so nothing is shared
but the inventory they read. Thin lab hosts (no engine imports) keep it to ~40 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.lab.labtools import fs, json_rows, ledger

pytestmark = [pytest.mark.lab]

A_ID, B_ID = "ctl-aaaa-0001", "ctl-bbbb-0002"   # describe() shows 8 characters


def start(fleet, controller: str, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fleetspec", "--root", str(fleet.root), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FLEETSPEC_CONTROLLER_ID": controller})


def deploy(fleet, controller: str, *hosts: str) -> subprocess.Popen:
    return start(fleet, controller, "deploy", *hosts, "--algo", "ddtree", "--serial", "100%", "--yes",
                 "--no-gates", "--json")


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def deploy_lines(fleet, host: str) -> list[dict]:
    return [e for e in ledger(fleet, host) if e.get("release") not in (None, "baseline")]


def wait_ok(fleet, hosts, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        rows = json_rows(fs(fleet, "status", *hosts, "--json").stdout)
        if len(rows) == len(hosts) and all(r["health"] == "ok" for r in rows):
            return
        assert time.monotonic() < deadline, rows
        time.sleep(1)


@pytest.fixture
def thin(thin_fleet):
    """The thin hosts on their baselines, no faults, before and after."""
    def reset():
        for host in thin_fleet.hosts:
            fs(thin_fleet, "lab", "fault", host, "--clear", check_rc=0)
            if thin_fleet.run(host, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode == 0:
                fs(thin_fleet, "rollback", host, check_rc=0)
        wait_ok(thin_fleet, thin_fleet.hosts)
    reset()
    yield thin_fleet
    reset()


def test_two_controllers_on_disjoint_groups_both_succeed(thin):
    a_host, b_host = thin.hosts[0], thin.hosts[1]
    a, b = deploy(thin, A_ID, a_host), deploy(thin, B_ID, b_host)
    (rc_a, out_a, err_a), (rc_b, out_b, err_b) = finish(a), finish(b)
    assert rc_a == 0, out_a + err_a
    assert rc_b == 0, out_b + err_b
    for proc, host, out in ((a, a_host, out_a), (b, b_host, out_b)):
        [row] = json_rows(out)
        assert row["host"] == host and row["status"] == "healthy", row
        lines = deploy_lines(thin, host)
        assert {e["release"] for e in lines} == {row["release"]}, lines
        assert all(e["by"].endswith(f":{proc.pid}") for e in lines), [e["by"] for e in lines]
    rows = {r["host"]: r for r in json_rows(fs(thin, "status", a_host, b_host, "--json", check_rc=0).stdout)}
    assert rows[a_host]["served_algo"] == rows[b_host]["served_algo"] == "DDTREE", rows


def test_a_host_named_by_both_is_refused_by_the_second(thin):
    host = thin.hosts[2]
    fs(thin, "lab", "fault", host, "slow_load=8", check_rc=0)   # the first holds the lock ≥ 8 s
    since = thin.run(host, "date +%s").stdout.decode().strip()
    a = start(thin, A_ID, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
    # The restarted engine logs its faults at start: from then on the first deploy waits in its
    # probes, holding the lock, with nothing more to change on the host before its commit.
    seen = f"journalctl -u sglang-qwen.service --since @{since} --no-pager -o cat | grep -q slow_load"
    deadline = time.monotonic() + 60
    while thin.run(host, seen).returncode:
        assert a.poll() is None and time.monotonic() < deadline, finish(a)
        time.sleep(0.2)
    lock = "/var/lib/fleetspec/sglang-qwen/lock"
    try:
        before = thin.run(host, "cat /etc/systemd/system/sglang-qwen.service.d/*.conf 2>/dev/null; "
                                "ls /var/lib/fleetspec/sglang-qwen/releases").stdout
        r = fs(thin, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates",
               env={"FLEETSPEC_CONTROLLER_ID": B_ID}, timeout=60)
        # The second controller's rollback meets the lock itself: refused, naming the holder.
        rb = fs(thin, "rollback", host, env={"FLEETSPEC_CONTROLLER_ID": B_ID}, timeout=60)
        assert a.poll() is None, "the first deploy ended before the second tried: the test proves nothing"
        after = thin.run(host, "cat /etc/systemd/system/sglang-qwen.service.d/*.conf 2>/dev/null; "
                               "ls /var/lib/fleetspec/sglang-qwen/releases").stdout
    finally:
        rc_a, out_a, err_a = finish(a)
    said, rb_said = r.stdout + r.stderr, rb.stdout + rb.stderr
    assert r.returncode != 0 and "Traceback" not in said, said
    assert rb.returncode == 2 and f"{lock} is held by" in rb_said and A_ID[:8] in rb_said, rb_said
    assert after == before
    assert rc_a == 0, out_a + err_a
    lines = deploy_lines(thin, host)
    assert len({e["release"] for e in lines}) == 1, lines
    assert all(e["by"].endswith(f":{a.pid}") for e in lines), [e["by"] for e in lines]
    assert f"{lock} is held by" in said and r.returncode == 2, said
    assert A_ID[:8] in said, said

"""The first minute a user has: the README's main job from a lab that is down, a deploy onto an
engine that is still loading, and one onto an engine that is stopped.

The engine tests run first in a lab session, on the session's first boot; the demo runs last
(conftest orders them so): it takes the lab down, checks that nothing is left, and runs the
README's first command from there, as on a fresh machine. Every other lab test starts from a
warm, settled fleet; these are the ones that do not.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lab import labtools
from tests.lab.conftest import ROOT
from tests.lab.labtools import fs

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.first_contact]

SERVICE = "sglang-qwen.service"
STATE = "/var/lib/fleetspec/sglang-qwen"
DEMO_HOSTS = ("ct129", "ct200")


def _status(root, host) -> dict:
    r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), "status", host, "--json"],
                       capture_output=True, text=True, timeout=120)
    return labtools.status_rows(r)[-1]                         # its exit code checked against the row


def _leftovers() -> dict:
    from fleetspec.lab import cgroups, network

    mounts = [line for line in Path("/proc/mounts").read_text().splitlines()
              if "fleetspec" in line or "fslab" in line]
    procs = subprocess.run(["pgrep", "-f", "systemd-nspawn.*fleetspec-lab"], capture_output=True, text=True).stdout.split()
    return {"netns": network.lab_namespaces(), "mounts": mounts, "cgroups": [str(p) for p in cgroups.leftovers()],
            "bridge": network.bridge_exists(), "processes": procs,
            "state": sorted(p.name for p in Path("/run/fleetspec-lab/hosts").glob("*"))}


@pytest.mark.last
def test_lab_down_leaves_nothing_and_the_demo_runs_again_from_cold(lab_fleet):
    """The session's last lab test. `fleetspec lab down` leaves nothing behind (also a crashed
    `lab up`'s debris, found by its fixed names), then `bash scripts/demo.sh`, exactly as the
    README gives it, runs from that lab that is down: its engines cold, as on a fresh machine.
    Exit 0, ct129 on a healthy DDTree release; its deploy met engines still loading and waited."""
    from fleetspec.lab import cgroups, hosts

    if tuple(lab_fleet.hosts) != DEMO_HOSTS or lab_fleet.root != ROOT:
        pytest.skip(f"the demo runs on {', '.join(DEMO_HOSTS)} of the checkout's fleet root; this run's lab hosts "
                    f"are {', '.join(lab_fleet.hosts)} of {lab_fleet.root}")
    others = [n for n in hosts.running() if (st := hosts.HostState.load(n)) and not st.owned_by(ROOT)]  # other roots'
    subprocess.run(["ip", "netns", "add", "fslab-ghost"], check=True)  # a crashed `lab up`'s debris
    cgroups.host_paths("ghost")[0].mkdir(parents=True)
    down = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(ROOT), "lab", "down"],
                          capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stderr
    stopped = set(re.findall(r"^lab host (\S+) stopped$", down.stdout, re.M))
    assert stopped and not stopped & set(others), down.stdout   # another root's hosts are not ours to stop
    if not others:
        left = _leftovers()
        assert left == {"netns": [], "mounts": [], "cgroups": [], "bridge": False, "processes": [], "state": []}
    else:
        assert not set(lab_fleet.addresses) & set(hosts.known())
    started = time.monotonic()
    demo = subprocess.run(["bash", str(ROOT / "scripts/demo.sh")], capture_output=True, text=True, timeout=1200)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out[-6000:]
    print(f"demo from a lab that was down: {time.monotonic() - started:.0f}s")
    # cold engines: where the first `status --all` still saw ct129 loading, the deploy waited for it
    # (how far a stand-in load gets before the deploy starts depends on the machine's load; the
    # wait itself is proven every run by the loading-engine test above)
    first = re.search(r"^ct129  (\S+)  \S+/\S+", out, re.M)     # its first status line
    assert first and first.group(1) in ("ok", "loading"), out[-6000:]
    if first.group(1) == "loading":
        assert "was still loading; waited" in out, out[-6000:]
    s = _status(ROOT, "ct129")
    assert s["health"] == "ok" and s["algo"] == "DDTREE" and s["served_algo"] == "DDTREE", s


def _snapshot(fleet, host) -> dict:
    """Everything a refused deploy must leave as it was."""
    out = labtools.sh(fleet, host, f"sha256sum /etc/systemd/system/{SERVICE}; ls -A /etc/systemd/system/{SERVICE}.d "
                                   f"2>/dev/null; echo ---; ls -A {STATE} {STATE}/releases 2>/dev/null; echo ---; "
                                   f"sha256sum {STATE}/ledger.jsonl 2>/dev/null; cat {STATE}/lock 2>/dev/null; "
                                   f"readlink {STATE}/current; true")
    return {"files": out, "active": labtools.sh(fleet, host, f"systemctl is-active {SERVICE} || true").strip()}


def _wait_ok(fleet, host, deadline=240) -> dict:
    end = time.monotonic() + deadline
    while True:
        s = _status(fleet.root, host)
        if s["health"] == "ok" or time.monotonic() > end:
            return s
        time.sleep(1)


def test_a_deploy_onto_an_engine_still_loading_waits_for_it_then_measures_and_passes(lab_fleet):
    """The engine restarted a moment ago: preflight waits for it (the restart wait's progress line),
    then the baseline is measured with no failed request and the gates pass."""
    host = lab_fleet.hosts[0]
    if labtools.sh(lab_fleet, host, f"readlink {STATE}/current || true").strip():
        fs(lab_fleet, "rollback", host, check_rc=0)
    fs(lab_fleet, "lab", "fault", host, "--clear", check_rc=0)
    labtools.sh(lab_fleet, host, f"systemctl restart {SERVICE}")
    r = fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--json")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    outcome = labtools.json_rows(r.stdout)[-1]
    assert outcome["status"] == "healthy", outcome
    steps = {e["name"]: e["detail"] for e in labtools.ledger(lab_fleet, host)
             if e["release"] == outcome["release"] and e["kind"] == "step" and e["state"] == "ok"}
    assert any("was still loading; waited" in note for note in steps["preflight"]["notes"]), steps["preflight"]
    assert steps["measure"]["figures"]["requests_failed"] == 0, steps["measure"]
    fs(lab_fleet, "rollback", host, check_rc=0)


def test_a_deploy_onto_a_stopped_engine_is_refused_and_changes_nothing(lab_fleet):
    """Stopped: one line naming the state and what to run, exit 2, the host as it was (unit,
    drop-ins, releases, ledger, no lock holder, still stopped)."""
    host = lab_fleet.hosts[1]
    fs(lab_fleet, "status", host, check_rc=0)          # its baseline (if any) and ledger exist as they are
    labtools.sh(lab_fleet, host, f"systemctl stop {SERVICE}")
    try:
        before = _snapshot(lab_fleet, host)
        assert before["active"] == "inactive", before
        r = fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes")
        assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"{host}:" in lines[0] and "inactive" in lines[0] and "--allow-unhealthy" in lines[0], lines
        assert f"systemctl status {SERVICE}" in lines[0], lines
        assert _snapshot(lab_fleet, host) == before
        # the explicit choice is refused with the gates on, before the host is read
        r = fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--allow-unhealthy")
        assert r.returncode == 2 and "--no-gates" in r.stderr, r.stderr
        assert _snapshot(lab_fleet, host) == before
    finally:
        labtools.sh(lab_fleet, host, f"systemctl start {SERVICE}")
    assert _wait_ok(lab_fleet, host)["health"] == "ok"


def test_a_baseline_measured_with_failed_requests_fails_the_deploy_before_anything_live_changes(lab_fleet):
    """The serving engine fails the baseline's requests (HTTP 500; /health still 200): the measure step fails
    (exit 1, failed step `measure`, the errors named), and the engine that serves is untouched:
    same unit, same drop-ins, same main process, no `current`."""
    host = lab_fleet.hosts[1]
    assert _wait_ok(lab_fleet, host)["health"] == "ok"
    pid = labtools.sh(lab_fleet, host, f"systemctl show -p MainPID --value {SERVICE}").strip()
    before = _snapshot(lab_fleet, host)["files"].split("---")[0]
    fs(lab_fleet, "lab", "fault", host, "fail_requests_after=0", check_rc=0)
    try:
        r = fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--json")
    finally:
        fs(lab_fleet, "lab", "fault", host, "--clear", check_rc=0)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    outcome = labtools.json_rows(r.stdout)[-1]
    assert outcome["failed_step"] == "measure" and "baseline's requests failed" in outcome["reason"], outcome
    assert labtools.sh(lab_fleet, host, f"systemctl show -p MainPID --value {SERVICE}").strip() == pid
    after = _snapshot(lab_fleet, host)["files"]
    assert after.split("---")[0] == before and not after.rstrip().endswith("current"), after
    assert not labtools.sh(lab_fleet, host, f"readlink {STATE}/current || true").strip()

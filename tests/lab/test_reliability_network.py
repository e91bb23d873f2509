"""Network faults: the lab host's link (its veth on the bridge) cut during the upload, during the
restart and during the probes, then restored.

A deploy that loses its host mid-way ends non-zero and says what to run: exit 1 and `fleetspec
status HOST` before the switch (nothing that runs was changed), exit 3 and `fleetspec rollback
HOST` after it. Once the link is back, `status` flags the interrupted deploy and the stale lock its
orphaned SSH session still holds, and one `fleetspec rollback` (which ends that stale lock) puts the
host back byte for byte. A short cut is ridden out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]


# With a 15 s command timeout and a 5 s connect timeout (TCP_USER_TIMEOUT 15 s), a lost host must be
# given up on well within this; past it the deploy is stuck, and its stacks (SIGUSR1) go into the
# failure message.
GIVE_UP_WITHIN = 240


@pytest.fixture(scope="session")
def rel(lab_fleet, tmp_path_factory):
    return R.rel_fixture(lab_fleet, tmp_path_factory)


@pytest.fixture(scope="module")
def netroot(rel, tmp_path_factory):
    """Same fleet, 15 s command timeout and 5 s connect timeout: a lost host is given up on sooner
    (file transfers: 15 s without progress; unacknowledged data: 3 x the connect timeout)."""
    return R.make_root(tmp_path_factory.mktemp("netroot"), rel.fleet.hosts,
                       playbooks={"ddtree.yaml": R.quick_smoke}, defaults={"command_timeout": 15, "connect_timeout": 5})


def _continue_then_cut(proc, host, *, settle: float, rate_limit: bool = False):
    """SIGCONT the paused deploy, let it run `settle` s (on a crawling link if asked), then cut the
    link until the deploy gives up; returns (rc, output). The link is always restored."""
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        if rate_limit:
            stack.enter_context(R.slow_link(host))
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(settle)
        with R.link_down(host):
            rc, out = R.collect(proc, timeout=GIVE_UP_WITHIN)
    R.record_max("network: most seconds until a lost host was given up on", int(time.monotonic() - began))
    return rc, out


def _check_recovery(rel, root, host, *, switched: bool):
    s = R.status(root, host)
    assert any("stale lock" in n for n in s["notes"]) or rel.lab.lock_free(host, wait=0), s
    if switched:
        assert any("interrupted" in n and f"fleetspec rollback {host}" in n for n in s["notes"]), s
    else:
        assert any("before switching (host unchanged)" in n for n in s["notes"]), s
        assert rel.lab.snapshot(host) == rel.pristine[host]
    r = R.fs(root, "rollback", host)             # one rollback, which also ends the stale lock
    assert r.returncode == 0, (r.stdout, r.stderr)
    R.count("rollbacks after a crash")
    rel.assert_on_baseline(host)
    rel.history_clean(host)


def test_link_cut_during_upload(rel, netroot):
    host = rel.h1
    rel.ensure_baseline(host)
    pid_before = rel.lab.main_pid(host)
    proc = R.start_paused(netroot, host, "stage", "--algo", "ddtree", "--no-gates")
    rel.lab.sh(host, "rm -rf /var/lib/fleetspec/objects")     # the content-addressed cache: all is sent again
    rc, out = _continue_then_cut(proc, host, settle=2.5, rate_limit=True)
    assert rc == 1, out
    assert "lost the host" in out and "before the switch" in out and f"fleetspec status {host}" in out, out
    assert "Traceback" not in out
    assert rel.lab.main_pid(host) == pid_before       # never restarted
    _check_recovery(rel, netroot, host, switched=False)


@pytest.mark.parametrize("step,settle", [("restart", 0.0), ("probes", 2.0)])
def test_link_cut_after_switch(rel, netroot, step, settle):
    host = rel.h1
    rel.ensure_baseline(host)
    proc = R.start_paused(netroot, host, step, "--algo", "ddtree", "--no-gates")
    rc, out = _continue_then_cut(proc, host, settle=settle)
    assert rc == 3, out
    assert "lost the host" in out and f"run fleetspec rollback {host}" in out and "rollback.sh" in out, out
    assert "Traceback" not in out
    _check_recovery(rel, netroot, host, switched=True)


def test_short_cut_during_probes_is_ridden_out(rel, netroot):
    host = rel.h1
    rel.ensure_baseline(host)
    proc = R.start_paused(netroot, host, "probes", "--algo", "ddtree", "--no-gates")
    try:
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(1.0)
        with R.link_down(host):
            time.sleep(3.0)
        rc, out = R.collect(proc, timeout=GIVE_UP_WITHIN)
    finally:
        if proc.poll() is None:
            R.kill(proc)
    assert rc == 0, out
    s = R.status(netroot, host)
    assert s["served_algo"] == "DDTREE" and s["release_status"] == "healthy", s
    R.fs(netroot, "rollback", host, check_rc=0)
    rel.assert_on_baseline(host)

"""Invariant 3: no two deploys act on one host at once; a stale lock never blocks forever and is
never stolen from a live holder.

Two deploys started together from two processes: exactly one proceeds, the other exits 2 naming
the holder. A rollback racing a deploy (and a deploy racing a rollback) is refused the same way.
A holder of this controller that is alive is never ended (by a deploy, a rollback or `unlock
--force`); once its process is gone the next rollback ends the stale lock itself. A holder from
another controller (which nobody here can see) blocks; `unlock --force` refuses it while its
session on the host is alive (fresh heartbeat) and ends it once that session has gone silent.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="session")
def rel(lab_fleet, tmp_path_factory):
    return R.rel_fixture(lab_fleet, tmp_path_factory)


def _popen(root, *args):
    return subprocess.Popen([sys.executable, "-m", "fleetspec", "--root", str(root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(R.ROOT)})


def test_two_deploys_at_once_exactly_one_proceeds(rel):
    host = rel.h2
    rel.ensure_baseline(host)
    a = _popen(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
    b = _popen(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
    R.count("races: two deploys")
    outs = {p.pid: p.communicate(timeout=600) for p in (a, b)}
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 2], {p.pid: (p.returncode, outs[p.pid]) for p in (a, b)}
    winner, loser = (a, b) if a.returncode == 0 else (b, a)
    err = outs[loser.pid][1]
    assert f"pid {winner.pid} on {socket.gethostname()}" in err and "is held by" in err, err
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1 and "Traceback" not in err, err
    # One release was made, by the winner; the loser wrote nothing.
    ledger = rel.lab.ledger(host)
    writers = {e["by"].rsplit(":", 1)[1] for e in ledger[-40:] if e["release"] not in ("baseline",)}
    assert str(loser.pid) not in writers
    s = R.status(rel.root, host)
    assert s["release_status"] == "healthy" and s["served_algo"] == "DDTREE", s
    R.fs(rel.root, "rollback", host, check_rc=0)
    rel.assert_on_baseline(host)


def test_rollback_racing_a_deploy_and_a_deploy_racing_a_rollback(rel):
    host = rel.h2
    rel.ensure_baseline(host)
    proc = R.start_paused(rel.root, host, "switch", "--algo", "ddtree", "--no-gates")   # holds the lock
    try:
        r = R.fs(rel.root, "rollback", host)
        R.count("races: rollback vs deploy")
        assert r.returncode == 2 and f"pid {proc.pid}" in r.stderr, (r.stdout, r.stderr)
        rc, out = R.finish(proc)
    finally:
        if proc.poll() is None:
            R.kill(proc)
    assert rc == 0, out
    rb = _popen(rel.root, "rollback", host)                       # now a rollback holds it …
    try:
        deadline = time.monotonic() + 60
        while rel.lab.lock_free(host, wait=0):
            assert time.monotonic() < deadline and rb.poll() is None, rb.communicate()
            time.sleep(0.2)
        d = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")   # … and a deploy races it
        R.count("races: deploy vs rollback")
        assert d.returncode == 2 and "rollback-to-baseline" in d.stderr and f"pid {rb.pid}" in d.stderr, d.stderr
    finally:
        out, err = rb.communicate(timeout=300)
    assert rb.returncode == 0, (out, err)
    rel.assert_on_baseline(host)


def _hold_lock(rel, host, holder) -> subprocess.Popen:
    """Hold the host's deploy lock exactly as fleetspec does (flock + holder record + `cat` on our
    ssh channel), naming `holder`; the ssh process is ours, ended by its pid."""
    from fleetspec.lab import ssh
    from fleetspec.remote.lock import acquire_script

    argv = [*ssh.argv(rel.fleet.root, rel.fleet.addresses[host]), "--", "sh", "-c",
            shlex.quote(acquire_script(f"{R.STATE}/lock", holder))]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline().decode()
    assert line.startswith("LOCKED"), line
    return proc


def _release(proc):
    proc.stdin.close()
    proc.wait(timeout=30)


def test_live_holder_is_never_stolen_and_a_dead_one_never_blocks(rel):
    from fleetspec.identity import controller_id, machine_boot
    from fleetspec.remote.lock_holder import Holder

    host = rel.h2
    snap = rel.ensure_baseline(host)
    sleeper = subprocess.Popen(["sleep", "600"])          # a live "fleetspec" of this controller, this boot
    holder = Holder(who="test", machine=socket.gethostname(), pid=sleeper.pid, since=time.time(),
                    release="20990101T000000Z-ddtree-live", controller=controller_id(), token=secrets.token_hex(16),
                    boot=machine_boot())
    lock = _hold_lock(rel, host, holder)
    try:
        for args in (["rollback", host], ["deploy", host, "--algo", "ddtree", "--yes", "--no-gates"],
                     ["unlock", host, "--force"]):
            r = R.fs(rel.root, *args)
            assert r.returncode == 2 and f"pid {sleeper.pid}" in r.stderr, (args, r.stderr)
            R.count("lock: refused a live holder")
        assert not rel.lab.lock_free(host, wait=0)          # still held: never stolen
        # What a deploy sees of a host a live holder is changing (here: its service stopped) is the
        # holder's business: refused at the lock (exit 2, naming it), never "needs attention" (3).
        rel.lab.sh(host, f"systemctl stop {R.SERVICE}")
        try:
            r = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
            assert r.returncode == 2 and f"pid {sleeper.pid}" in r.stderr, (r.returncode, r.stderr)
            R.count("lock: refused a live holder")
        finally:
            rel.lab.sh(host, f"systemctl start {R.SERVICE}")
        R.wait_healthy(rel.root, host)
        os.kill(sleeper.pid, signal.SIGKILL)               # the holder dies; its session lives on
        sleeper.wait()
        s = R.status(rel.root, host)
        assert any("stale lock" in n for n in s["notes"]), s
        r = R.fs(rel.root, "rollback", host)               # ends the stale lock by itself
        assert "ending a stale lock" in r.stdout + r.stderr, (r.stdout, r.stderr)
        # … then rolls back, or, on a host no deploy has touched yet (this test alone), says so
        assert r.returncode == 0 or (r.returncode == 2 and "no baseline recorded" in r.stderr), (r.stdout, r.stderr)
        assert rel.lab.lock_free(host, wait=5)
        R.count("lock: stale holder ended")
    finally:
        if sleeper.poll() is None:
            os.kill(sleeper.pid, signal.SIGKILL)
            sleeper.wait()
        _release(lock)
    assert rel.lab.snapshot(host) == snap
    rel.assert_on_baseline(host)


def test_holder_on_another_machine_blocks_until_unlock_force(rel):
    from fleetspec.remote.lock_holder import Holder

    host = rel.h2
    rel.ensure_baseline(host)
    holder = Holder(who="alice", machine="bastion-elsewhere", pid=4242, since=time.time() - 3600,
                    release="20990101T000000Z-ddtree-else", controller="controller-of-alice",
                    token=secrets.token_hex(16))
    lock = _hold_lock(rel, host, holder)          # its session sends no heartbeat after taking it
    try:
        r = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
        assert r.returncode == 2 and "alice (pid 4242 on bastion-elsewhere" in r.stderr, r.stderr
        assert f"fleetspec unlock {host} --force" in r.stderr
        u = R.fs(rel.root, "unlock", host, "--force")          # its heartbeat is fresh: alive
        assert u.returncode == 2 and "still alive" in u.stderr, (u.stdout, u.stderr)
        R.count("lock: refused a live holder")
        time.sleep(3)
        u = R.fs(rel.root, "unlock", host, "--force", env={"FLEETSPEC_LOCK_STALE_S": "1"})
        assert u.returncode == 0 and "unlocked" in u.stdout, (u.stdout, u.stderr)
        R.count("lock: unlock --force of a foreign holder")
        assert rel.lab.lock_free(host, wait=10)
        assert lock.wait(timeout=30) is not None          # its remote `cat` was ended
    finally:
        if lock.poll() is None:
            _release(lock)
    rel.assert_on_baseline(host)

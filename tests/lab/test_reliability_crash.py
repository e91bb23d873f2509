"""Invariant 1 under SIGKILL: fleetspec killed at every named deploy step (FLEETSPEC_PAUSE_AT), and
inside two long steps, in release mode and (switch, mid-switch, restart, probes) in in-place mode.

After each kill, byte for byte: a deploy killed before `switch` left the host exactly as it was
(unit sha256, ExecStart as systemd holds it, drop-in folder, `current`, sglang files against RECORD,
the service not even restarted); one killed after it is flagged by `status`, refused by the next
deploy (exit 3 naming the rollback), and one `fleetspec rollback` puts it back byte for byte.
The lock is freed by the kernel once the killed process's session ends (invariant 3), and the
baseline and the ledger stay whole (invariant 2).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from fleetspec.ops.steps import STEPS
from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]

RELEASE_STEPS = list(STEPS)      # the playbook's smoke.when is before-switch
RUNNER_STARTED = {"render", "measure", "smoke"}    # stage started the smoke runner in the background
POST_SWITCH = {"restart", "probes", "gates", "commit", "switch.files"}

# (mode, pause point, seconds to let it run on before the kill: 0 = killed at the pause)
POINTS = ([("release", step, 0.0) for step in RELEASE_STEPS]
          + [("release", "smoke", 1.0),        # waiting for the smoke tests' background python (~3-6 s)
             ("in-place", "switch", 0.0),
             ("in-place", "switch.files", 0.0),  # live files replaced, `current` not yet flipped
             ("in-place", "restart", 0.0),
             ("in-place", "probes", 0.0),
             ("in-place", "probes", 4.0)])      # while the new engine loads (slow_load: it loads for minutes)
LOADING = "slow_load=300"   # the +Ns probes point: the engine still loads at the kill, however fast the machine


@pytest.fixture(scope="session")
def rel(lab_fleet, tmp_path_factory):
    return R.rel_fixture(lab_fleet, tmp_path_factory)


@pytest.mark.parametrize("mode,step,after", POINTS,
                         ids=[f"{m}-{s}" + (f"+{a:g}s" if a else "") for m, s, a in POINTS])
def test_sigkill_at_each_step(rel, mode, step, after):
    host = rel.h1
    rel.ensure_baseline(host)
    pid_before = rel.lab.main_pid(host)
    if step == "smoke" and after:     # killed while the tests run: no kept verdict to replay at once
        rel.lab.sh(host, "rm -rf /var/lib/fleetspec/smoke-verdicts")
    loading = step == "probes" and after > 0
    if loading:           # read at start by the engine that the deploy's restart starts
        R.lab_fault(host, LOADING)
    try:
        proc = R.start_paused(rel.root, host, step, "--algo", "ddtree", "--no-gates", "--mode", mode)
        if after:
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(after)
        R.kill(proc)
    finally:
        if loading:
            R.clear_faults(host)
    R.count("crash points")
    assert rel.lab.lock_free(host, wait=30), "a killed deploy's lock was not freed"
    s = R.status(rel.root, host)
    post = step in POST_SWITCH
    if not post:
        if mode == "release" and step in RUNNER_STARTED:
            _runner_ends(rel, host)
        # Nothing that runs was changed, and the service was not even restarted.
        assert rel.lab.snapshot(host) == rel.pristine[host]
        assert rel.lab.main_pid(host) == pid_before
        assert s["drift"] == "pristine" and s["health"] == "ok", s
        assert not any("fleetspec rollback" in n for n in s["notes"]), s
        if step in ("stage", "switch"):      # one rollback is harmless there too
            R.fs(rel.root, "rollback", host, check_rc=0)
        rel.assert_on_baseline(host, notes_ok=True)
        return
    assert any("interrupted" in n and f"fleetspec rollback {host}" in n for n in s["notes"]), s
    again = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
    assert again.returncode == 3 and f"fleetspec rollback {host}" in again.stderr, (again.stdout, again.stderr)
    assert "Traceback" not in again.stderr
    r = R.fs(rel.root, "rollback", host)
    assert r.returncode == 0, (r.stdout, r.stderr)
    R.count("rollbacks after a crash")
    rel.assert_on_baseline(host)
    rel.history_clean(host)


def _runner_ends(rel, host):
    """The killed deploy's smoke runner ends on its own (its verdict written) rather than run on
    (a replayed verdict: no runner, `rc` 0 and `reused` written by the stage command)."""
    folder = rel.lab.sh(host, "ls -td /var/lib/fleetspec/*/releases/*/smoke | head -1").strip()
    assert folder.endswith("/smoke"), folder
    if rel.lab.rc(host, f"test -e {folder}/reused") == 0:
        assert rel.lab.sh(host, f"cat {folder}/rc").split() == ["0"]
        assert rel.lab.rc(host, f"test -e {folder}/pid") != 0
        return
    script = (f"for i in $(seq 600); do [ -e {folder}/rc ] && break; sleep 0.1; done; "
              f"pid=$(cat {folder}/pid); cat {folder}/rc; grep -qF {folder}/ /proc/$pid/cmdline 2>/dev/null "
              f"&& echo RUNNING || echo GONE")
    out = rel.lab.sh(host, script, timeout=90).split()
    assert out[-1] == "GONE" and out[0] == "0", out


def test_after_the_sweep_every_release_is_finished_and_the_baseline_kept(rel):
    """Invariant 2 over the whole sweep: after one healthy deploy and its rollback, the ledger
    parses whole, every release has a terminal status, the baseline is the one first recorded,
    and the releases kept on the host are bounded (the healthy and failed ones beyond keep=3 are
    pruned: the sweep leaves ~20 failed releases of ~6,000 links each)."""
    import json

    from fleetspec.model import ledger as L

    host = rel.h1
    rel.ensure_baseline(host)
    R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)
    kept = rel.lab.sh(host, f"ls {R.STATE}/releases").split()
    statuses = L.parse("".join(json.dumps(e) + "\n" for e in rel.lab.ledger(host))).releases()
    by_kind: dict[str, list[str]] = {}
    for rid in kept:
        st = statuses.get(rid)
        kind = ("kept" if st == L.HEALTHY else "finished" if st in (L.FAILED, L.ROLLED_BACK, L.SUPERSEDED)
                else "staged" if st == L.STAGED else f"other:{st}")
        by_kind.setdefault(kind, []).append(rid)
    # keep=3 healthy, the newest 3 finished ones (failed, rolled back, superseded: the sweep's and
    # earlier tests' benchmarks and restaged releases), at most one staged ahead; nothing else
    assert (len(by_kind.pop("kept", [])) <= 3 and len(by_kind.pop("finished", [])) <= 3
            and len(by_kind.pop("staged", [])) <= 1 and not by_kind), (kept, statuses)
    R.fs(rel.root, "rollback", host, check_rc=0)
    rel.assert_on_baseline(host)
    entries = rel.lab.ledger(host)
    parsed = L.parse("".join(json.dumps(e) + "\n" for e in entries))
    assert not [rid for rid, st in parsed.releases().items() if st not in L.TERMINAL and rid != "baseline"]
    rel.check_baseline_kept(host)
    rel.history_clean(host)

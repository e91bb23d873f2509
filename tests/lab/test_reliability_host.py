"""Host faults: disk full (before and during staging), the service's python missing (before the
deploy and under the restart), fleetspec's state folder read-only, a unit edited by hand, a corrupt
baseline, a torn ledger line. Every fault is undone in a `finally`; every test ends with the host
byte for byte on its baseline (invariant 1), the baseline intact and the ledger readable (2).
"""

from __future__ import annotations

import json
import shlex

import pytest

from fleetspec.model.inventory import load_inventory
from fleetspec.model.layout import local_mirror
from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="session")
def rel(lab_fleet, tmp_path_factory):
    return R.rel_fixture(lab_fleet, tmp_path_factory)


def _one_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    return lines


def test_disk_full_before_the_deploy_is_refused(rel):
    host = rel.h1
    snap = rel.ensure_baseline(host)
    try:
        R.lab_fault(host, "disk_full")
        r = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
        assert r.returncode == 2, (r.stdout, r.stderr)
        lines = _one_line(r)
        assert len(lines) == 1 and "MiB free" in lines[0], lines
        assert rel.lab.snapshot(host) == snap
    finally:
        R.clear_faults(host)
    rel.assert_on_baseline(host)


def test_disk_full_during_staging_fails_before_switch(rel):
    host = rel.h1
    snap = rel.ensure_baseline(host)
    pid_before = rel.lab.main_pid(host)
    proc = R.start_paused(rel.root, host, "stage", "--algo", "ddtree", "--no-gates", "--json")
    try:
        R.lab_fault(host, "disk_full")
        rc, out = R.finish(proc)
    finally:
        if proc.poll() is None:
            R.kill(proc)
        R.clear_faults(host)
    assert rc == 1, out
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["status"] == "failed" and outcome["failed_step"] == "stage", outcome
    assert "No space left" in outcome["reason"] or "space" in outcome["reason"].lower(), outcome
    assert rel.lab.snapshot(host) == snap and rel.lab.main_pid(host) == pid_before
    # The ledger may hold a line torn by ENOSPC: it is skipped with a warning, never a crash.
    h = R.fs(rel.root, "history", host)
    assert h.returncode == 0 and "Traceback" not in h.stderr, h.stderr
    rel.note_torn(host, h.stderr)
    rel.assert_on_baseline(host, notes_ok=True)


def _move_python(rel, host, back=False):
    py = "/root/ml-env/bin/python3" if rel.fleet.hosts.index(host) == 0 else "/opt/sglang/venv/bin/python3"
    moved = py + ".fleetspec-test-moved"
    src, dst = (moved, py) if back else (py, moved)
    rel.lab.sh(host, f"if [ -e {moved} ] || [ -L {moved} ] || [ {int(back)} = 0 ]; then mv {src} {dst}; fi")
    if not back:
        R.count("faults: python moved away")


def test_python_missing_before_the_deploy(rel):
    host = rel.h1
    snap = rel.ensure_baseline(host)
    try:
        _move_python(rel, host)
        r = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
        assert r.returncode == 2, (r.stdout, r.stderr)
        lines = _one_line(r)
        assert len(lines) == 1 and "no sglang found for python" in lines[0], lines
        s = R.fs(rel.root, "status", host, "--json")              # status still answers
        assert s.returncode == 0 and "Traceback" not in s.stderr
        assert rel.lab.snapshot(host) == snap
    finally:
        _move_python(rel, host, back=True)
    rel.assert_on_baseline(host)


def test_python_missing_at_restart_reverts_or_names_the_fix(rel):
    """The python vanishes after the switch: the new release cannot start, the revert cannot either
    (the baseline needs the same python): exit 3 naming the rollback; once it is back, one rollback."""
    host = rel.h1
    rel.ensure_baseline(host)
    proc = R.start_paused(rel.root, host, "restart", "--algo", "ddtree", "--no-gates")
    try:
        _move_python(rel, host)
        rc, out = R.finish(proc)
    finally:
        if proc.poll() is None:
            R.kill(proc)
        _move_python(rel, host, back=True)
    assert rc == 3, out
    assert f"fleetspec rollback {host}" in out and "Traceback" not in out, out
    r = R.fs(rel.root, "rollback", host)
    assert r.returncode == 0, (r.stdout, r.stderr)
    R.count("rollbacks after a crash")
    rel.assert_on_baseline(host)
    rel.history_clean(host)


def test_state_folder_read_only_changes_nothing(rel):
    host = rel.h1
    snap = rel.ensure_baseline(host)
    pid_before = rel.lab.main_pid(host)
    d = "/var/lib/fleetspec"
    try:
        rel.lab.sh(host, f"mount --bind {d} {d} && mount -o remount,bind,ro {d}")
        R.count("faults: state folder read-only")
        r = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
        assert r.returncode in (1, 2), (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr + r.stdout
        assert "Read-only file system" in r.stderr + r.stdout, (r.stdout, r.stderr)
        assert rel.lab.snapshot(host) == snap and rel.lab.main_pid(host) == pid_before
    finally:
        rel.lab.sh(host, f"while mountpoint -q {d} && grep -q ' {d} .* ro[ ,]' /proc/mounts; do umount {d}; done; true")
    rel.assert_on_baseline(host, notes_ok=True)


def test_unit_edited_by_hand_is_reported_and_refused(rel):
    host = rel.h1
    snap = rel.ensure_baseline(host)
    original = rel.lab.sh(host, f"base64 {R.UNIT}")
    operator_dropin = f"{R.DROPIN_DIR}/10-operator.conf"
    try:
        for edit, what in [(f"printf '# tuned by hand\\n' >> {R.UNIT}", R.UNIT),
                           (f"printf %s {shlex.quote(original)} | base64 -d > {R.UNIT}; mkdir -p {R.DROPIN_DIR}; "
                            f"printf '[Service]\\nEnvironment=TUNED=1\\n' > {operator_dropin}", "drop-in")]:
            rel.lab.sh(host, edit + " && systemctl daemon-reload")
            R.count("faults: unit edited by hand")
            s = R.status(rel.root, host)
            assert s["unit_drift"] and "unit edited by hand" in s["drift"], s
            assert any(f"fleetspec baseline {host} --retake" in n for n in s["notes"]), s
            lines_before = len(rel.lab.ledger(host))
            r = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
            assert r.returncode == 3, (r.stdout, r.stderr)
            said = r.stdout + r.stderr
            assert f"run fleetspec baseline {host} --retake" in r.stderr and what in said, said
            assert "Traceback" not in said
            assert len(rel.lab.ledger(host)) == lines_before          # refused before anything was written
            rel.check_baseline_kept(host)                              # not silently replaced
    finally:
        rel.lab.sh(host, f"rm -f {operator_dropin}; rmdir {R.DROPIN_DIR} 2>/dev/null; "
                         f"printf %s {shlex.quote(original)} | base64 -d > {R.UNIT} && systemctl daemon-reload")
    assert rel.lab.snapshot(host) == snap
    rel.assert_on_baseline(host)


def test_corrupt_baseline_is_refused_clearly_and_repaired_from_the_local_copy(rel, tmp_path_factory):
    host = rel.h1
    rel.ensure_baseline(host)
    path = f"{R.STATE}/baseline/baseline.json"
    good = rel.lab.sh(host, f"base64 {path}")
    inv_host = load_inventory(rel.root / "inventory" / "lab.yaml").hosts[host]
    mirror = local_mirror(rel.root, inv_host, R.SERVICE) / "baseline.json"
    kept_mirror = mirror.read_bytes() if mirror.is_file() else None
    if kept_mirror is not None:
        mirror.unlink()
    try:
        rel.lab.sh(host, f"truncate -s 100 {path}")
        R.count("faults: baseline corrupted")
        # No verified local copy in this fleet root: refused, one line, nothing changed.
        for args in (["deploy", host, "--algo", "ddtree", "--yes", "--no-gates"], ["rollback", host]):
            r = R.fs(rel.root, *args)
            assert r.returncode == 3, (args, r.stdout, r.stderr)
            said = r.stdout + r.stderr
            assert "is corrupt" in said and f"fleetspec baseline {host} --retake" in said, said
            assert "Traceback" not in said
        s = R.fs(rel.root, "status", host, "--json")
        assert s.returncode == 0 and "Traceback" not in s.stderr, s.stderr
        # With the fleet root's verified mirror of it, the host copy is put back (same bytes).
        mirror.parent.mkdir(parents=True, exist_ok=True)
        import base64

        mirror.write_bytes(base64.b64decode(good))
        from fleetspec.remote.transport import Transport

        t = Transport(inv_host)          # the copy is this machine's: its host key, as fleetspec records it
        try:
            (mirror.parent / "identity.json").write_text(json.dumps({"host": host, "host_key": t.host_key()}))
        finally:
            t.close()
        r = R.fs(rel.root, "rollback", host)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "repaired" in r.stdout + r.stderr, (r.stdout, r.stderr)
        assert rel.lab.sh(host, f"base64 {path}") == good
    finally:
        rel.lab.sh(host, f"printf %s {shlex.quote(good)} | base64 -d > {path}")
        if kept_mirror is not None:
            mirror.write_bytes(kept_mirror)
    rel.check_baseline_kept(host)
    rel.assert_on_baseline(host)


def test_torn_ledger_line_is_skipped_with_a_warning(rel):
    """A line torn mid-write (no newline) is skipped by history and status with a warning, and
    the next line written is not glued onto it (it stays readable)."""
    host = rel.h1
    rel.ensure_baseline(host)
    rel.lab.sh(host, f"printf '%s' '{{\"by\":\"torn\",\"kind\":\"st' >> {R.STATE}/ledger.jsonl")
    R.count("faults: torn ledger line")
    r = R.fs(rel.root, "rollback", host)               # writes ledger lines after the torn one
    assert r.returncode == 0, (r.stdout, r.stderr)
    h = R.fs(rel.root, "history", host, "--json")
    assert h.returncode == 0 and "torn ledger line" in h.stderr, h.stderr
    rel.note_torn(host, h.stderr)
    last = [json.loads(line) for line in h.stdout.splitlines()][-1]
    assert last["name"] == "rollback" and last["state"] == "ok", last
    s = R.fs(rel.root, "status", host, "--json")
    assert s.returncode == 0 and "Traceback" not in s.stderr
    rel.assert_on_baseline(host)

"""The render step's one command (issue 17): drop-in, rollback.sh and guard unit written from
stdin, fsynced, and linted by systemd-analyze verify in the same command; the verdict is parsed
purely from systemd-analyze's own output (captured on this machine, systemd 252)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from fleetspec.errors import FleetspecError, RemoteError
from fleetspec.ops.hoststate import DROPIN_NAME
from fleetspec.ops.rendering import lint_verdict
from fleetspec.remote import files, systemd
from fleetspec.remote.api import CommandResult

UNIT = b"[Service]\nExecStart=/bin/sleep 5\n"
# Captured: `SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no -- x.service` with the drop-in shown.
CAPTURED = {
    "unknown_key": (0, "", "/tmp/anz/x.service.d/zz-fleetspec.conf:2: Unknown key 'FooBar' in section [Service], "
                           "ignoring.\n"),
    "relative_exec": (1, "", "/tmp/anz/x.service.d/zz-fleetspec.conf:3: Neither a valid executable name nor an "
                             "absolute path: relative/path\nx.service: Service has no ExecStart=, ExecStop=, or "
                             "SuccessAction=. Refusing.\nUnit x.service has a bad unit file setting.\n"),
    "missing_binary": (1, "", "x.service: Command /nonexistent/bin is not executable: No such file or directory\n"),
    "clean": (0, "", ""),
}


def result(case: str) -> CommandResult:
    rc, out, err = CAPTURED[case]
    return CommandResult("verify", rc, out, err)


def test_verdicts_on_captured_output():
    assert lint_verdict(result("clean")) == "ok"
    assert lint_verdict(None) == "skipped (no systemd-analyze)"
    with pytest.raises(FleetspecError, match="Unknown key 'FooBar'"):     # ignored by systemd: refused
        lint_verdict(result("unknown_key"))
    with pytest.raises(FleetspecError, match="Neither a valid executable"):
        lint_verdict(result("relative_exec"))
    assert lint_verdict(result("missing_binary")).startswith("warnings: x.service: Command /nonexistent/bin")


def test_split_written():
    assert systemd.split_written(f"a  b\n{systemd.WRITTEN}\nverify out\n") == ("a  b\n", "verify out\n")
    assert systemd.split_written("no marker\n") is None


def _writes(tmp_path: Path, dropin: bytes):
    rdir = tmp_path / "rel"
    (rdir / "unit").mkdir(parents=True)
    return rdir, [(str(rdir / "unit" / DROPIN_NAME), dropin, 0o644), (str(rdir / "rollback.sh"), b"#!/bin/sh\n", 0o755)]


def test_one_command_writes_syncs_and_lints(t, tmp_path, seen):
    live = tmp_path / "live.conf"
    live.write_bytes(b"previous drop-in\n")
    dropin = b"[Service]\nExecStart=\nExecStart=/bin/sleep 6\nEnvironment=A=1\n"
    rdir, writes = _writes(tmp_path, dropin)
    done = systemd.write_and_verify(t, writes, [str(rdir / "unit"), str(rdir)], str(tmp_path / "run"),
                                    "fs-render.service", UNIT, DROPIN_NAME, writes[0][0],
                                    hash_paths=(str(live), str(tmp_path / "absent.conf")))
    assert len(seen) == 1                                               # one round trip, no SFTP
    assert done.sha256 == {str(live): hashlib.sha256(b"previous drop-in\n").hexdigest()}
    assert lint_verdict(done.verify) == "ok"
    for path, data, mode in writes:
        assert Path(path).read_bytes() == data and stat.S_IMODE(os.stat(path).st_mode) == mode
    assert not list(rdir.rglob("*" + files.TMP_SUFFIX))
    assert list((tmp_path / "run").iterdir()) == []                    # the lint's scratch copy is gone


def test_the_lint_sees_the_drop_in_as_written(t, tmp_path):
    rdir, writes = _writes(tmp_path, b"[Service]\nExecStart=\nExecStart=relative/path x\n")
    done = systemd.write_and_verify(t, writes, [str(rdir)], str(tmp_path / "run"), "fs-render.service", UNIT,
                                    DROPIN_NAME, writes[0][0])
    with pytest.raises(FleetspecError, match=f"{DROPIN_NAME}:3: Neither a valid executable"):
        lint_verdict(done.verify)


def test_a_failed_write_lands_nothing_and_skips_the_lint(t, tmp_path):
    rdir, writes = _writes(tmp_path, b"[Service]\n")
    writes.append((str(tmp_path / "no-such-folder" / "guard.service"), b"x", 0o644))
    with pytest.raises(RemoteError, match="writing .*failed"):
        systemd.write_and_verify(t, writes, [str(rdir)], str(tmp_path / "run"), "fs-render.service", UNIT,
                                 DROPIN_NAME, writes[0][0])
    assert not (tmp_path / "run").exists()


def test_a_short_stdin_never_lands(t, tmp_path):
    """The sha256 check refuses a temp file that got fewer (or other) bytes than sent."""
    target = tmp_path / "f"
    script = files.write_from_stdin(str(target), b"0123456789", 0o644)
    r = t.run_script(script, timeout=30, check=False, stdin=b"01234")
    assert r.rc != 0 and not target.exists()
    files.write_file(t, str(target), b"0123456789", 0o640)
    assert target.read_bytes() == b"0123456789" and stat.S_IMODE(os.stat(target).st_mode) == 0o640


def test_the_previous_drop_in_hash_comes_from_its_render_line_under_the_lock():
    from types import SimpleNamespace

    from fleetspec.model import ledger as L
    from fleetspec.ops.rendering import _rendered_sha

    lines = [L.Entry.step("r1", "render", L.StepState.OK, dropin_sha256="a" * 64),
             L.Entry.step("r2", "render", L.StepState.OK, dropin_sha256="b" * 64),
             L.Entry.step("r1", "render", L.StepState.STARTED)]
    text = "".join(e.to_line() + "\n" for e in lines)
    state = SimpleNamespace(lock=SimpleNamespace(read_text=text))
    assert _rendered_sha(state, "r1") == "a" * 64 and _rendered_sha(state, "r3") == ""
    assert _rendered_sha(SimpleNamespace(lock=None), "r1") == ""

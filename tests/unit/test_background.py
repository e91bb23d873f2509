"""remote/background.py against a real sshd and real shells: a process started by one SSH command
outlives it, its verdict is read by another, a timeout ends it, and `stop` kills only its own."""

from __future__ import annotations

import subprocess
import sys
import time

from fleetspec.remote import background, files


def _pid(folder):
    return int((folder / "pid").read_text())


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return not f.read().rsplit(") ", 1)[1].startswith("Z")     # a zombie has ended
    except FileNotFoundError:
        return False


def _until(check, within: float) -> bool:
    """check() once it holds, polled up to `within` s (the end of a killed process is an event:
    how long it takes to come depends on the machine)."""
    end = time.monotonic() + within
    while not check() and time.monotonic() < end:
        time.sleep(0.05)
    return check()


def test_started_process_outlives_the_command_and_its_verdict_is_read_later(t, tmp_path):
    """The process waits for a gate that the test opens only after `start` returned: a `start` that
    waited for the process would never return (no wall-clock threshold, so a loaded machine cannot
    fail it)."""
    folder, gate = tmp_path / "bg", tmp_path / "gate"
    code = (f"import os, sys, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
            "print(sys.stdin.read().upper()); print('warn', file=sys.stderr); sys.exit(3)")
    background.start(t, str(folder), files.python_c(sys.executable, code, rundir=str(tmp_path / "run")),
                     stdin=b"payload", timeout_s=60)
    assert _running(_pid(folder)), "the process ended before its gate opened"
    assert not (folder / "rc").exists()
    gate.touch()
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    v = background.wait(t, str(folder), timeout=30)
    assert (v.rc, v.stdout.strip(), v.stderr.strip()) == (3, "PAYLOAD", "warn")


def test_the_timeout_ends_the_whole_group_and_the_verdict_says_no_exit_code(t, tmp_path):
    folder = tmp_path / "bg"
    background.start(t, str(folder), "sleep 30 & sleep 30", stdin=b"", timeout_s=1)
    v = background.wait(t, str(folder), timeout=30)
    assert v.rc in (None, 124)          # timeout's own code when the shell outlived its TERM

    def left():
        return [p for p in subprocess.run(["pgrep", "-s", str(_pid(folder))], capture_output=True,
                                          text=True).stdout.split() if _running(int(p))]
    # the kills are sent; their end is awaited (a sleep 30 left alive would still be there at the end)
    assert _until(lambda: not left(), 25), f"processes of the runner's session still alive: {left()}"


def test_stop_kills_the_running_group_and_not_a_reused_pid(t, tmp_path):
    folder = tmp_path / "bg"
    background.start(t, str(folder), "sleep 30", stdin=b"", timeout_s=60)
    pid = _pid(folder)
    assert background.stop(t, str(folder)) is True
    assert _until(lambda: not _running(pid), 25)        # its sleep 30 would outlive that
    assert background.wait(t, str(folder), timeout=10).rc is None
    other = subprocess.Popen(["sleep", "30"])     # the recorded pid now names a process that is not the runner
    try:
        (folder / "pid").write_text(f"{other.pid}\n")
        assert background.stop(t, str(folder)) is False
        assert _running(other.pid)
    finally:
        other.kill()
        other.wait()


def test_stop_on_a_finished_or_missing_folder_is_a_no_op(t, tmp_path):
    folder = tmp_path / "bg"
    background.start(t, str(folder), "true", stdin=b"", timeout_s=10)
    assert background.wait(t, str(folder), timeout=10).rc == 0
    assert background.stop(t, str(folder)) is False
    assert background.stop(t, str(tmp_path / "never")) is False

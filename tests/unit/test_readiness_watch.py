"""The readiness wait's crash rule (remote/systemd.exited) on the states a restart goes through.

Each state is `systemctl show -p …` text as systemd 252 prints it for a Type=simple unit with
Restart=on-failure (the lab's units); the lab test test_fault_in_new_release_reverts_to_nextn
checks the rule against real systemd.
"""

import pytest

from fleetspec.remote import systemd


def show(active, sub, result="success", n=0, code=0, status=0, start=0, exit_=0) -> systemd.UnitWatch:
    text = (f"ActiveState={active}\nSubState={sub}\nResult={result}\nNRestarts={n}\nExecMainCode={code}\n"
            f"ExecMainStatus={status}\nExecMainStartTimestampMonotonic={start}\n"
            f"ExecMainExitTimestampMonotonic={exit_}\n")
    return systemd.parse_watch(text)


BEFORE = systemd.Restarted(n_restarts=0, main_start_us=1_000)


def test_the_old_process_stopping_is_not_the_new_one_crashing():
    assert not systemd.exited(show("deactivating", "stop-sigterm", start=1_000), BEFORE)
    assert not systemd.exited(show("inactive", "dead", code=1, status=0, start=1_000, exit_=2_000), BEFORE)


def test_a_crash_loop_not_yet_replaced_by_the_restart_job_is_not_ours():
    looping = show("activating", "auto-restart", "exit-code", n=3, code=1, status=1, start=900, exit_=950)
    assert not systemd.exited(looping, systemd.Restarted(n_restarts=3, main_start_us=900 + 0))
    assert systemd.exited(looping, None)          # no restart of ours to compare with: a crash


def test_starting_and_running_are_not_exits():
    assert not systemd.exited(show("activating", "start", start=3_000), BEFORE)
    assert not systemd.exited(show("active", "running", start=3_000), BEFORE)


def test_the_new_main_process_exiting_is_a_failure_at_once_before_any_automatic_restart():
    crashed = show("activating", "auto-restart", "exit-code", n=0, code=1, status=1, start=3_000, exit_=4_000)
    assert systemd.exited(crashed, BEFORE)
    assert crashed.describe().endswith("main process exited with status 1, NRestarts=0")
    # Restart=no: the unit just ends, Result=success for a clean exit; still not a server
    assert systemd.exited(show("inactive", "dead", code=1, status=0, start=3_000, exit_=4_000), BEFORE)
    killed = show("activating", "auto-restart", "signal", code=2, status=9, start=3_000, exit_=4_000)
    assert systemd.exited(killed, BEFORE) and "killed with status 9" in killed.describe()


def test_a_later_restart_by_systemd_or_a_failed_state_is_a_failure():
    assert systemd.exited(show("activating", "start", n=1, start=9_000), BEFORE)
    assert systemd.exited(show("failed", "failed", "exit-code", start=1_000), BEFORE)


def test_restart_command_notes_the_state_in_the_same_command_and_quotes_the_name():
    class Recorder:
        def run_script(self, script, timeout=None, check=False):
            self.script = script
            return type("R", (), {"stdout": "NRestarts=2\nExecMainStartTimestampMonotonic=77\n"})()

    rec = Recorder()
    assert systemd.restart(rec, "a b.service") == systemd.Restarted(2, 77)
    assert rec.script.startswith("systemctl show -p ActiveState,") and rec.script.count("'a b.service'") == 3
    assert rec.script.index("systemctl show") < rec.script.index("reset-failed") < rec.script.index("restart --no-block")


# The readiness wait as one host command (issue 17): systemd.watch_script / UnitStream ----------------
def test_a_watch_line_parses_as_the_same_show_output_does():
    import json
    from pathlib import Path

    real = json.loads((Path(__file__).parents[1] / "fixtures/facts/systemd/crashed-transient-lab.json").read_text())
    line = "\t".join(real["stdout"].splitlines()) + "\t"      # what watch_script's `tr '\n' '\t'` makes of it
    unit = systemd.parse_watch_line(line)
    assert (unit.active_state, unit.sub_state, unit.result, unit.n_restarts) == ("failed", "failed", "exit-code", 0)
    assert systemd.exited(unit, BEFORE)
    assert systemd.parse_watch_line(".") is None and systemd.parse_watch_line("") is None
    crashed = show("activating", "auto-restart", "exit-code", n=0, code=1, status=1, start=3_000, exit_=4_000)
    text = ("ActiveState=activating\nSubState=auto-restart\nResult=exit-code\nNRestarts=0\nExecMainCode=1\n"
            "ExecMainStatus=1\nExecMainStartTimestampMonotonic=3000\nExecMainExitTimestampMonotonic=4000\n")
    assert systemd.parse_watch_line(text.replace("\n", "\t")) == crashed


def _state_file(tmp_path, active, sub, start=3_000, exit_=0):
    path = tmp_path / "state"
    tmp = tmp_path / "state.tmp"
    tmp.write_text(f"ActiveState={active}\nSubState={sub}\nResult=success\nNRestarts=0\nExecMainCode=1\n"
                   f"ExecMainStatus=1\nExecMainStartTimestampMonotonic={start}\nExecMainExitTimestampMonotonic={exit_}\n")
    tmp.replace(path)
    return path


def _remote_pids(t, tmp_path):
    return t.run_script(f"pgrep -f 'cat [{str(tmp_path)[0]}]{str(tmp_path)[1:]}/state' || true").stdout.split()


def test_the_stream_sees_a_change_at_once_and_ends_when_closed(t, tmp_path):
    import time

    path = _state_file(tmp_path, "activating", "start")
    stream = systemd.UnitStream(t, "svc", 60, show=f"cat {path}")
    try:
        assert stream.latest(wait=30).sub_state == "start"
        _state_file(tmp_path, "activating", "auto-restart", exit_=4_000)
        # watch returns None when its time runs out: a state back means it returned on the change
        seen = stream.watch(50, lambda u: systemd.exited(u, BEFORE))
        assert seen is not None and seen.sub_state == "auto-restart"
        assert stream.latest().sub_state == "auto-restart" and not stream.ended
    finally:
        stream.close()
    deadline = time.monotonic() + 30       # awaited: its end comes within a tick of the machine's time
    while _remote_pids(t, tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _remote_pids(t, tmp_path), "the host loop outlived its channel"


def test_the_stream_ends_by_itself_at_its_deadline(t, tmp_path):
    import time

    path = _state_file(tmp_path, "active", "running")
    stream = systemd.UnitStream(t, "svc", 1, show=f"cat {path}")
    try:
        assert stream.latest(wait=60) is not None
        deadline = time.monotonic() + 60      # the loop's own end (2 s after it started), awaited
        while stream.latest() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stream.ended and stream.latest() is None       # the caller falls back to one look
    finally:
        stream.close()


def test_the_watch_restarts_after_printing_the_state_before(t, tmp_path):
    """restart= (issue 17): the state before is printed first and read as the Restarted point; the
    restart runs after it, in the same command; the loop then streams the new state."""
    path = _state_file(tmp_path, "active", "running", start=3_000)
    restart = f"sleep 0.2; {_state_cmd(tmp_path, 'activating', 'start', 9_000)}"
    stream = systemd.UnitStream(t, "svc", 60, show=f"cat {path}", restart=restart)
    try:
        assert stream.before(timeout=60) == systemd.Restarted(0, 3_000)
        after = stream.latest(wait=60)                 # the loop starts once the restart was issued
        assert (after.sub_state, after.main_start_us) == ("start", 9_000)
        assert not systemd.exited(after, stream.restarted)
    finally:
        stream.close()


def test_a_watch_that_ends_before_its_first_line_never_restarts(t, tmp_path):
    from fleetspec.errors import RemoteError

    marker = tmp_path / "restarted"
    stream = systemd.UnitStream(t, "svc", 60, show=f"cat {tmp_path}/absent", restart=f"touch {marker}")
    try:
        with pytest.raises(RemoteError, match="before its first line"):
            stream.before(timeout=10)
    finally:
        stream.close()
    assert not marker.exists()


def _state_cmd(tmp_path, active, sub, start):
    import shlex

    text = (f"ActiveState={active}\nSubState={sub}\nResult=success\nNRestarts=0\nExecMainCode=1\n"
            f"ExecMainStatus=1\nExecMainStartTimestampMonotonic={start}\nExecMainExitTimestampMonotonic=0\n")
    tmp = shlex.quote(str(tmp_path / "state.tmp"))
    return f"printf %s {shlex.quote(text)} > {tmp} && mv {tmp} {shlex.quote(str(tmp_path / 'state'))}"


def test_the_old_process_answering_ready_is_not_taken_for_the_new_one(t, tmp_path, monkeypatch):
    """`restart --no-block` only queues the job: for a moment the old engine still answers /ready
    200 (and then /health 503 while it drains, or 200 with the same algorithm on a ddtree to
    ddtree change). The wait probes nothing until the unit's main process is a new one (a lab
    bench once failed a good release on the old engine's draining /health)."""
    import http.server
    import json
    import threading
    import time

    from fleetspec.ops import probes

    mode = {"new": False}
    asked = []

    class Engine(http.server.BaseHTTPRequestHandler):
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            asked.append((mode["new"], self.path))
            if self.path == "/server_info":
                self._send(200, {"speculative_algorithm": "DDTREE" if mode["new"] else "NEXTN"})
            else:
                self._send(200 if mode["new"] or self.path == "/ready" else 503, {})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self._send(200, {"text": " Paris", "meta_info": {"completion_tokens": 1}})

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    path = _state_file(tmp_path, "active", "running", start=BEFORE.main_start_us)   # the old process

    said, waiting = [], threading.Event()

    def progress(line):
        said.append(line)
        if "has not replaced the old process" in line:
            waiting.set()

    def replaced():                # once the wait has seen the old process, the new one starts
        waiting.wait(120)
        mode["new"] = True
        _state_file(tmp_path, "active", "running", start=3_000)

    threading.Thread(target=replaced, daemon=True).start()
    # "svc" is no unit here (no systemd): who listens is another test's matter (test_security_audit.py)
    monkeypatch.setattr(probes, "listener_problem", lambda *a: None)
    stream = systemd.UnitStream(t, "svc", 600, show=f"cat {path}")
    woken = []                     # what each of the wait's stream.watch calls returned
    watch = stream.watch
    stream.watch = lambda seconds, stop: woken.append(watch(seconds, stop)) or woken[-1]
    # a pause far longer than the test: only the stream's news of the new process ends it
    spec = probes.ProbeSpec(port=httpd.server_address[1], expected_algorithm="DDTREE", ready_timeout=600,
                            interval=300)
    try:
        assert stream.latest(wait=60) is not None     # the loop runs (else the wait would ask systemctl)
        result = probes._wait(t, "svc", spec, BEFORE, progress, time.monotonic, stream)
    finally:
        stream.close()
        httpd.shutdown()
        httpd.server_close()
    assert result.ok, result
    assert asked and all(new for new, _ in asked), asked        # nothing asked of the old process
    assert any("has not replaced the old process" in line for line in said), said
    # woken by the new process, not by the end of a pause
    assert woken and woken[-1] is not None and woken[-1].main_start_us == 3_000, woken

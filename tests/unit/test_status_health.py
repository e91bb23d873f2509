"""`status` tells loading from down from unhealthy from ok, and `--watch` waits for ok.

A real sshd on loopback, a real HTTP server that takes its time to open its port (as a model
load does), and — since this machine has no systemd — a `systemctl` on the sshd's PATH that
answers `show` for one unit from the state of that server's real process (alive: active/running,
gone: failed) and from when it was started. Everything else is the real status code: the facts
over SSH, /health through the SSH channel, the classification, the CLI and its exit codes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.model.inventory import load_inventory
from fleetspec.ops import status as S
from fleetspec.remote.transport import TransportPool
from tests.conftest import Sshd, free_port

SERVER = textwrap.dedent("""\
    import http.server, os, sys, time
    port, delay, code, gate = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    time.sleep(delay)                      # the model load: the port stays closed meanwhile
    while gate and not os.path.exists(gate):      # ... or until the test opens the gate
        time.sleep(0.05)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(code if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """)

SYSTEMCTL = textwrap.dedent("""\
    #!/bin/sh
    # Stand-in for systemd on a machine without it: the unit is the process named in $STATE/pid
    # (its ControlGroup: the deepest cgroup that process is in).
    STATE={state}
    [ "$1" = show ] || exit 1
    pid=$(cat "$STATE/pid" 2>/dev/null)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then a=active; s=running; else a=failed; s=failed; pid=0; fi
    case "$3" in
      ControlGroup) [ "$pid" != 0 ] && cut -d: -f3- "/proc/$pid/cgroup" | sort | tail -1; exit 0;;
    esac
    case "$4" in
      *InactiveExitTimestampMonotonic*) echo "InactiveExitTimestampMonotonic=$(cat "$STATE/started_us" 2>/dev/null || echo 0)";;
      *) printf 'LoadState=loaded\\nActiveState=%s\\nSubState=%s\\nMainPID=%s\\n' "$a" "$s" "$pid";;
    esac
    """)


class Unit:
    """The 'service': one real server process, started and killed by pid."""

    def __init__(self, state, port):
        self.state, self.port, self.proc = state, port, None

    def start(self, delay: float, code: int = 200, started_ago: float = 0.0, gate: str = "") -> None:
        self.stop()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(self.port), str(delay), str(code), gate],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (self.state / "pid").write_text(str(self.proc.pid))
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ago
        (self.state / "started_us").write_text(str(int(since_boot * 1e6)))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, ssh_client_key):
    work = tmp_path_factory.mktemp("health")
    state, bin_dir = work / "unit", work / "bin"
    state.mkdir()
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(SYSTEMCTL.format(state=state))
    (bin_dir / "systemctl").chmod(0o755)
    server = Sshd(work / "sshd", free_port(), ssh_client_key)
    with open(server.workdir / "sshd_config", "a") as f:
        f.write(f"SetEnv PATH={bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")
    server.start()
    root = work / "root"
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir(parents=True)
    port = free_port()
    (work / "known_hosts").write_text(server.known_hosts_line)
    (root / "inventory" / "lab.yaml").write_text(textwrap.dedent(f"""\
        defaults: {{user: root, ssh_key: {ssh_client_key}, known_hosts: {work / 'known_hosts'}, connect_timeout: 3,
                   vars: {{python: {sys.executable}, service: sglang-qwen.service, api_port: {port},
                          extra: {{ready_timeout: 30}}}}}}
        hosts:
          ct203: {{address: 127.0.0.1, port: {server.port}}}
        """))
    unit = Unit(state, port)
    yield root, unit
    unit.stop()
    server.stop()


def one(root):
    host = load_inventory(root / "inventory" / "lab.yaml").hosts["ct203"]
    with TransportPool() as pool:
        return S.fleet_status(pool, [host])[0]


def test_loading_then_down_then_unhealthy_then_ok(fleet):
    root, unit = fleet
    unit.start(delay=3600)                     # a model load that outlasts the test
    row = one(root)
    assert row.reachable and row.state == "active/running"
    assert row.health == "loading" and row.http == "refused", row
    assert row.up_s is not None and row.up_s < 20 and row.ready_timeout == 30
    assert any("loading: port not answering yet (started" in n for n in row.notes), row.notes

    unit.stop()                                # the engine died: the unit failed
    row = one(root)
    assert row.health == "down" and row.state == "failed", row
    assert any("down: unit failed/failed" in n for n in row.notes), row.notes

    unit.start(delay=3600, started_ago=45)     # still loading 45 s after start: past the 30 s timeout
    row = one(root)
    assert row.health == "down" and row.state == "active/running", row
    assert any("past the ready timeout (30s)" in n for n in row.notes), row.notes

    unit.start(delay=0, code=503)
    _until(lambda: one(root).http == "503")
    assert one(root).health == "unhealthy"

    unit.start(delay=0)
    _until(lambda: one(root).http == "200")
    assert one(root).health == "ok"


def _until(check, timeout=20):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.3)


def test_watch_waits_for_a_load_and_says_ok(fleet, monkeypatch):
    """The load ends once the watch has shown it loading (a gate the watch's own round opens, not a
    delay the first round might outlast on a loaded machine)."""
    root, unit = fleet
    gate = fleet[0].parent / "loaded"
    gate.unlink(missing_ok=True)
    unit.start(delay=0, gate=str(gate))
    real = S.watch

    def watch(*args, on_round, **kw):
        def round_seen(rows, elapsed):
            on_round(rows, elapsed)
            if any(r.health == S.LOADING for r in rows):
                gate.touch()
        return real(*args, on_round=round_seen, **kw)

    monkeypatch.setattr(S, "watch", watch)
    r = CliRunner().invoke(main, ["--root", str(root), "status", "--watch", "--deadline", "300", "--interval", "0.5"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert any(ln.endswith("ct203 loading") for ln in lines), r.output     # it saw the load …
    assert "all 1 hosts ok after" in r.output                               # … and its end


def test_watch_deadline_exit_codes(fleet):
    root, unit = fleet
    unit.start(delay=3600)
    r = CliRunner().invoke(main, ["--root", str(root), "status", "--watch", "--deadline", "1", "--interval", "0.5"])
    assert r.exit_code == 4, r.output                                       # still loading at the deadline
    assert "deadline 1s passed; not ok: ct203 (loading)" in r.output
    unit.stop()
    r = CliRunner().invoke(main, ["--root", str(root), "status", "--watch", "--deadline", "1", "--interval", "0.5"])
    assert r.exit_code == 1, r.output                                       # down at the deadline
    assert "not ok: ct203 (down)" in r.output


def test_classify_is_pure():
    assert S.classify("200", None, None, None, 900) == ("ok", None)
    assert S.classify("503", "active", "running", 5, 900)[0] == "unhealthy"
    assert S.classify("refused", "activating", "start", 5, 900)[0] == "loading"
    assert S.classify("refused", "activating", "auto-restart", 5, 900)[0] == "down"    # between two tries
    assert S.classify("refused", "active", "running", 5, 900, n_restarts=2) == \
        ("down", "crash loop: systemd restarted it 2 times since it was last started by hand")
    assert S.classify("503", "active", "running", 5, 900, n_restarts=2)[0] == "unhealthy"
    assert S.classify("refused", "active", "running", 901, 900)[0] == "down"
    assert S.classify("refused", "inactive", "dead", None, 900)[0] == "down"
    assert S.classify("refused", None, None, None, 900)[0] == "down"                   # no systemd to ask


@pytest.mark.parametrize("columns", [80, 160])
def test_table_fits_the_terminal_and_cuts_nothing(fleet, columns):
    root, unit = fleet
    unit.start(delay=3600)
    r = CliRunner().invoke(main, ["--root", str(root), "status"], env={"COLUMNS": str(columns), "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert all(len(ln) <= columns for ln in lines), lines
    words = set(r.output.split())
    assert {"ct203", "loading", "active/running", "sglang-qwen.service"} <= words, r.output
    row = next(ln for ln in lines if ln.startswith("ct203"))
    assert row.split()[1:3] == ["loading", "active/running"]
    flat = " ".join(r.output.split())
    assert "ct203: loading: port not answering yet (started" in flat and "ready timeout 30s)" in flat


def test_unit_age_parser():
    from fleetspec.remote.facts import unit_age

    out = "InactiveExitTimestampMonotonic=5000000\nuptime=65.40\n"       # systemd 252's `show -p` form
    assert unit_age.parse(out) == unit_age.UnitAge(True, 60.4)
    assert unit_age.parse("InactiveExitTimestampMonotonic=0\nuptime=9.1\n") == unit_age.UnitAge(True, None)
    assert unit_age.parse(unit_age.NO_SYSTEMCTL + "\n") == unit_age.UnitAge(False, None)
    with pytest.raises(ValueError):
        unit_age.parse("garbage\n")

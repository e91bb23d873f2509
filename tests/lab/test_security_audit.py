"""The second security audit's host-side holes, driven on a real lab host by unprivileged users.

- A local user (`nobody`) binds a port the probes would ask, names the process with an OSC 52
  escape (set the clipboard) and answers every request like a healthy DDTREE engine: neither
  `status` nor the readiness probe counts it (the listener is not in the unit's cgroup), and the
  process name in the reason reaches the terminal escaped. The engine's own port counts.
- A user without sudo (`nosudo`) owns a venv with a `.pth` that records who ran it: `status` and
  `deploy --plan` with that venv as the host's python refuse to run it as root, and it never ran.

No engine is restarted: the squatter takes a spare port (the inventory of a fleet root of our own
points the probes at it) while the host's engine keeps its own.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest

from fleetspec.model.inventory import load_inventory
from fleetspec.ops import probes
from fleetspec.remote.transport import Transport
from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PORT = 30977
PIDFILE = "/tmp/fleetspec-squatter.pid"
SQUATTER = r'''
import ctypes, http.server, json, os
ctypes.CDLL(None).prctl(15, b"\x1b]52;c;cm0=\x07", 0, 0, 0)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"speculative_algorithm": "DDTREE\x1b]52;c;cm0=\x07", "version": "0.5.23"}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", %d), H)
open("%s", "w").write(str(os.getpid()))
s.serve_forever()
''' % (PORT, PIDFILE)
MARKER = "/var/tmp/fleetspec-pth-ran"
VENV = "/home/nosudo/venv"


def _status(root, host, *extra):
    r = R.fs(root, "status", host, *extra)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_a_local_user_on_the_api_port_is_not_the_service(lab_fleet, tmp_path_factory):
    host = lab_fleet.hosts[0]
    lab = R.Lab(lab_fleet)
    R.wait_healthy(lab_fleet.root, host)          # the engine on its own port: its listener is the unit's
    start = f"rm -f {PIDFILE}; cd / && setsid python3 -c {shlex.quote(SQUATTER)} </dev/null >/dev/null 2>&1 &"
    lab.sh(host, f"runuser -u nobody -- sh -c {shlex.quote(start)}")
    try:
        for _ in range(50):
            if lab.rc(host, f"test -s {PIDFILE}") == 0:
                break
            time.sleep(0.1)
        pid = int(lab.sh(host, f"cat {PIDFILE}").strip())
        assert lab.sh(host, f"stat -c %U /proc/{pid}").strip() == "nobody"
        root = R.make_root(tmp_path_factory.mktemp("squatted"), [host], inventory_vars={host: {"api_port": PORT}})
        row = json.loads(_status(root, host, "--json").stdout.splitlines()[0])
        assert row["health"] == "unhealthy" and row["served_algo"] is None, row
        said = " ".join(row["notes"])
        assert f"port {PORT} is held by pid {pid} (\x1b]52;c;cm0=\x07), not by a process of {R.SERVICE}" in said
        shown = _status(root, host)                                   # the table: the comm shown escaped
        text = shown.stdout + shown.stderr
        assert "\x1b" not in text and "\x07" not in text, repr(text)
        assert "\\x1b]52;c;cm0=\\x07" in text and f"pid {pid}" in text, text
        inv = load_inventory(root / "inventory" / "lab.yaml").hosts[host]
        own_port = load_inventory(lab_fleet.inventory).hosts[host].vars.api_port
        t = Transport(inv)
        try:                                                         # the readiness probe's own look
            foreign = probes.listener_problem(t, R.SERVICE, PORT)
            assert foreign and f"pid {pid}" in foreign and "its answers are not the service's" in foreign
            assert probes.listener_problem(t, R.SERVICE, own_port) is None      # the engine counts
        finally:
            t.close()
    finally:
        lab.sh(host, f"[ -s {PIDFILE} ] && kill $(cat {PIDFILE}); rm -f {PIDFILE}", ok=False)


def test_a_venv_a_local_user_can_write_is_never_run_as_root(lab_fleet, tmp_path_factory):
    host = lab_fleet.hosts[0]
    lab = R.Lab(lab_fleet)
    pth = f"import os; open({MARKER!r}, 'a').write(str(os.getuid()) + chr(10))"
    make = (f"python3 -m venv --without-pip --system-site-packages {VENV} && "
            f"printf '%s\\n' {shlex.quote(pth)} > {VENV}/lib/python3.11/site-packages/zz-planted.pth")
    lab.sh(host, f"rm -rf {VENV} {MARKER}; runuser -u nosudo -- sh -c {shlex.quote(make)}")
    try:
        assert lab.sh(host, f"stat -c %U {VENV}/lib/python3.11/site-packages/zz-planted.pth").strip() == "nosudo"
        root = R.make_root(tmp_path_factory.mktemp("uservenv"), [host],
                           inventory_vars={host: {"python": f"{VENV}/bin/python3"}})
        row = json.loads(_status(root, host, "--json").stdout.splitlines()[0])
        said = " ".join(row["notes"])
        assert f"{VENV}/bin/python3 runs as root, but {VENV} can be changed by others (owner uid 1002" in said, row
        plan = R.fs(root, "deploy", host, "--algo", "ddtree", "--plan")
        assert plan.returncode == 2 and "Traceback" not in plan.stderr, (plan.stdout, plan.stderr)
        out = plan.stdout + plan.stderr                                 # --plan says a refusal on stdout
        assert f"runs as root, but {VENV} can be changed" in out and "vars.python in" in out, out
        assert lab.rc(host, f"test -e {MARKER}") != 0, lab.sh(host, f"cat {MARKER}")   # never ran, as anyone
    finally:
        lab.sh(host, f"rm -rf {VENV} {MARKER}", ok=False)

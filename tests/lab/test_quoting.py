"""Arguments survive fleetspec's quoting byte for byte, through real systemd 252 and a real shell.

Two paths carry operator data to a host: unit files (ExecStart= words escaped by systemd_unit.exec_line)
and shell commands (built with shlex.quote, run by the transport). For random argument strings —
spaces, quotes, `%`, `$`, backslashes, newlines, control characters, non-ASCII — the process on the
host must see exactly the argv we meant, and nothing may execute.
"""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetspec.model.inventory import load_inventory
from fleetspec.remote.transport import Transport
from fleetspec.systemd_unit import exec_line

pytestmark = [pytest.mark.lab]

HOST = "ct200"
PRINT_ARGV = "import sys, json; print('ARGV ' + json.dumps(sys.argv[1:]), flush=True)"
ALPHABET = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
NASTY = st.sampled_from(["%", "%%", "%n", "$", "$$", "${HOME}", "$(touch /tmp/pwned)", "`id`", ";", "\\", "\\\\",
                         '"', "'", "\n", "\t", " ", "\r", "\x01", "é", "--speculative-algorithm", "-", "\\x41"])
ARG = st.lists(st.one_of(NASTY, st.text(ALPHABET, max_size=12)), max_size=4).map("".join)


@pytest.fixture(scope="module")
def t(lab_fleet):
    host = load_inventory(lab_fleet.inventory).hosts[HOST]
    transport = Transport(host)
    yield transport
    transport.run_script("rm -f /etc/systemd/system/fleetspec-quoting.service /tmp/pwned; systemctl daemon-reload")
    transport.close()


def _run_unit(t, argvs: list[list[str]]) -> list[list[str]]:
    """One oneshot unit, one ExecStart= per argv; the host's python prints what it received."""
    lines = "\n".join(f"ExecStart={exec_line(['/usr/bin/python3', '-c', PRINT_ARGV, *argv])}" for argv in argvs)
    unit = f"[Unit]\nDescription=fleetspec quoting test\n[Service]\nType=oneshot\n{lines}\n"
    t.put_bytes(unit.encode(), "/etc/systemd/system/fleetspec-quoting.service")
    r = t.run_script("systemctl daemon-reload && journalctl --rotate -q >/dev/null 2>&1; "
                     "since=$(date +%s.%N); systemctl start fleetspec-quoting.service && "
                     "journalctl -u fleetspec-quoting.service --since=@$since -o cat --no-pager", timeout=120)
    assert r.rc == 0, r.stderr
    got = []
    for line in r.stdout.splitlines():
        if line.startswith("ARGV "):
            got.append(json.loads(line[5:]))
    return got


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(ARG, min_size=1, max_size=5), min_size=1, max_size=4))
def test_exec_line_round_trips_through_real_systemd(t, argvs):
    # systemd's journal splits a record at a newline; print JSON (escaped) so lines stay whole.
    assert _run_unit(t, argvs) == argvs
    assert t.run_script("test -e /tmp/pwned").rc != 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ARG, min_size=1, max_size=6))
def test_shell_commands_never_break_out_of_their_quoting(t, argv):
    r = t.run(["python3", "-c", PRINT_ARGV, *argv], timeout=30)
    assert r.rc == 0, r.stderr
    assert json.loads(r.stdout.split("ARGV ", 1)[1]) == argv
    script = " ".join(shlex.quote(a) for a in ["python3", "-c", PRINT_ARGV, *argv])
    r2 = t.run_script(script, timeout=30)
    assert json.loads(r2.stdout.split("ARGV ", 1)[1]) == argv
    assert t.run_script("test -e /tmp/pwned").rc != 0

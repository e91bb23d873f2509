"""ExecStart forms on a real systemd 252 host (the 0.5.23 lab host, like ct200).

Refused forms are refused at preflight with the host unchanged (a `bash -c` wrapper; an admin
drop-in that sorts after fleetspec's). Supported forms are moved and rolled back byte-exact: an
`-@` ExecStart set by a `systemctl edit`-style override.conf (fleetspec's drop-in wins over it, and
the derived command is what systemd holds before the restart), and an `sglang serve MODEL` unit
(the smoke parse takes the words the serve entry point parses).
"""

from __future__ import annotations

import signal

import pytest

from fleetspec.lab.profiles import CT200_ARGV, PROFILES, SERVICE, unit_text
from tests.lab import labtools, reliability_lab
from tests.lab.labtools import fs

pytestmark = [pytest.mark.lab, pytest.mark.slow]

UNIT = f"/etc/systemd/system/{SERVICE}"
DROPINS = f"/etc/systemd/system/{SERVICE}.d"
STATE = "/var/lib/fleetspec/sglang-qwen"
PY = CT200_ARGV[0]
ARGV0 = PY.rsplit("/", 1)[0] + "/python"     # another name of the same venv interpreter
ARGS = CT200_ARGV[3:]                     # after `python3 -m sglang.launch_server`
TREE = ("find /etc/systemd/system /var/lib/fleetspec -type f -print0 2>/dev/null | sort -z | xargs -0 sha256sum; "
        f"systemctl show -p ExecStart --value {SERVICE} | sed 's/ ; start_time=.*//'")   # runtime fields cut


@pytest.fixture
def host(lab_fleet):
    """The 0.5.23 host on its baseline with the lab's own unit; put back the same way after."""
    name = lab_fleet.hosts[1]
    _reset(lab_fleet, name)
    yield name
    _reset(lab_fleet, name)


def sh(fleet, name, script, timeout=120) -> str:
    return labtools.sh(fleet, name, script, timeout)


def _reset(fleet, name):
    if sh(fleet, name, f"readlink {STATE}/current || true").strip():
        fs(fleet, "rollback", name, check_rc=0)
    original = unit_text(PROFILES["ct200"])
    _install(fleet, name, original, dropins={})


def _install(fleet, name, unit: str, dropins: dict[str, str], restart: bool = True):
    """Write the unit and exactly these admin drop-ins, restart, and record it as the baseline."""
    script = [f"rm -rf {DROPINS}", f"mkdir -p {DROPINS}", f"cat > {UNIT} <<'EOF_UNIT'\n{unit}EOF_UNIT"]
    for fname, text in dropins.items():
        script.append(f"cat > {DROPINS}/{fname} <<'EOF_UNIT'\n{text}EOF_UNIT")
    script.append("systemctl daemon-reload")
    if restart:
        script.append(f"systemctl restart {SERVICE}")
    sh(fleet, name, "\n".join(script))
    if restart:
        _wait(fleet, name)
        fs(fleet, "baseline", name, "--retake", check_rc=0)


def _wait(fleet, name, deadline=90):
    import json
    import time

    end = time.monotonic() + deadline
    while time.monotonic() < end:
        r = fs(fleet, "status", name, "--json")
        rows = [json.loads(x) for x in r.stdout.strip().splitlines()[-1:] if x.startswith("{")]
        if r.returncode == 0 and rows and rows[0].get("health") == "ok":
            return rows[0]
        time.sleep(2)
    raise AssertionError(f"{name} not healthy after {deadline}s")


def _unit_with(exec_start: str) -> str:
    lines = unit_text(PROFILES["ct200"]).splitlines(keepends=True)
    return "".join(f"ExecStart={exec_start}\n" if ln.startswith("ExecStart=") else ln for ln in lines)


def test_refused_forms_leave_the_host_unchanged(lab_fleet, host):
    wrapped = "/bin/bash -c 'exec " + " ".join([PY, "-m", "sglang.launch_server", *ARGS]) + "'"
    _install(lab_fleet, host, _unit_with(wrapped), {}, restart=False)    # running, unit rewritten
    before = sh(lab_fleet, host, TREE)
    r = fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
    assert r.returncode == 2 and "shell wrapper" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sh(lab_fleet, host, TREE) == before

    _install(lab_fleet, host, unit_text(PROFILES["ct200"]), {"zzz-local.conf": "[Service]\nLimitNOFILE=65536\n"})
    before = sh(lab_fleet, host, TREE)
    r = fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
    assert r.returncode == 2 and "zzz-local.conf sorts after fleetspec's" in r.stderr, r.stderr
    assert sh(lab_fleet, host, TREE) == before


def test_override_dropin_with_at_prefix_is_beaten_and_rolled_back_exactly(lab_fleet, host):
    """`systemctl edit` writes override.conf; here it sets `-@<venv>/python3 <venv>/python -m …`.
    (argv[0] must stay a path into the venv: python finds its venv from argv[0], so a bare name
    such as `sglang-r1` loses site-packages — seen on this host: "No module named 'sglang'".)"""
    override = "[Service]\nExecStart=\nExecStart=-@" + PY + " " + ARGV0 + " -m sglang.launch_server " + " ".join(ARGS) + "\n"
    _install(lab_fleet, host, unit_text(PROFILES["ct200"]), {"override.conf": override})
    shown = sh(lab_fleet, host, f"systemctl show -p ExecStart --value {SERVICE}")
    assert f"path={PY} ; argv[]={ARGV0} -m" in shown and "ignore_errors=yes" in shown
    before = sh(lab_fleet, host, TREE)
    r = fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)
    assert "healthy" in r.stdout
    dropin = sh(lab_fleet, host, f"cat {DROPINS}/zz-fleetspec.conf")
    assert f"\nExecStart=-@{PY} {ARGV0} -m sglang.launch_server " in dropin
    shown = sh(lab_fleet, host, f"systemctl show -p ExecStart --value {SERVICE}")
    assert f"path={PY} ; argv[]={ARGV0} -m sglang.launch_server" in shown and "ignore_errors=yes" in shown
    assert "--speculative-num-draft-tokens" not in shown        # the baseline's group was replaced
    assert sorted(sh(lab_fleet, host, f"ls -A {DROPINS}").split()) == ["override.conf", "zz-fleetspec.conf"]
    fs(lab_fleet, "rollback", host, check_rc=0)
    after = sh(lab_fleet, host, TREE)
    # unit, override.conf and ExecStart byte-exact; only fleetspec's own state folder grew
    keep = lambda text: [ln for ln in text.splitlines() if "/var/lib/fleetspec" not in ln]
    assert keep(after) == keep(before)


def test_sglang_serve_unit_deploys_and_rolls_back_exactly(lab_fleet, host):
    venv_bin = PY.rsplit("/", 1)[0]
    serve = " ".join([f"{venv_bin}/sglang", "serve", ARGS[1], *ARGS[2:]])     # `sglang serve MODEL …`
    _install(lab_fleet, host, _unit_with(serve), {})
    before = sh(lab_fleet, host, TREE)
    r = fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)
    assert "healthy" in r.stdout
    shown = sh(lab_fleet, host, f"systemctl show -p ExecStart --value {SERVICE}")
    assert f"argv[]={venv_bin}/sglang serve {ARGS[1]} " in shown
    fs(lab_fleet, "rollback", host, check_rc=0)
    keep = lambda text: [ln for ln in text.splitlines() if "/var/lib/fleetspec" not in ln]
    assert keep(sh(lab_fleet, host, TREE)) == keep(before)


def test_admin_dropin_appearing_before_the_switch_stops_the_restart(lab_fleet, host):
    """An admin drop-in that overrides ExecStart appears after preflight (a race, or an admin at
    work): after daemon-reload systemd does not hold the derived command, so the deploy fails at
    `switch` and reverts — it never restarts onto the old command."""
    proc = reliability_lab.start_paused(lab_fleet.root, host, "switch", "--algo", "ddtree", "--no-gates")
    # as `systemctl edit` leaves it: the drop-in written and systemd reloaded, before the switch
    late = "[Service]\nExecStart=\nExecStart=" + " ".join([PY, "-m", "sglang.launch_server", *ARGS]) + "\n"
    sh(lab_fleet, host, f"cat > {DROPINS}/zzz-late.conf <<'EOF_UNIT'\n{late}EOF_UNIT\nsystemctl daemon-reload")
    held = sh(lab_fleet, host, f"systemctl show -p DropInPaths,ExecStart {SERVICE}")
    assert f"{DROPINS}/zzz-late.conf" in held and "DFLASH" in held, held
    proc.send_signal(signal.SIGCONT)
    out = "".join(proc.seen) + proc.stdout.read()
    if proc.wait(timeout=600) != 1 or "does not hold the derived ExecStart" not in out:
        steps = [e for e in labtools.ledger(lab_fleet, host) if e.get("step") in ("switch", "restart", "probes")]
        raise AssertionError(f"{out}\nledger: {steps[-6:]}\nheld before the switch: {held}")
    shown = sh(lab_fleet, host, f"systemctl show -p ExecStart --value {SERVICE}")
    assert "--speculative-algorithm DFLASH" in shown and "DDTREE" not in shown      # never served
    assert sh(lab_fleet, host, f"ls -A {DROPINS}").split() == ["zzz-late.conf"]      # ours reverted
    assert not sh(lab_fleet, host, f"readlink {STATE}/current || true").strip()
    sh(lab_fleet, host, f"rm -f {DROPINS}/zzz-late.conf && systemctl daemon-reload")

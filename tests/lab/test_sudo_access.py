"""ct129 reached as operators reach cloud hosts: a user other than root with passwordless sudo.

`ops` (NOPASSWD rule) must deploy, report status, roll back and run the host's rollback.sh exactly
as root does: the same bytes back (unit, ExecStart, drop-ins), and every file fleetspec makes owned
and moded as when root makes it. `nosudo` (no rule) and `pwsudo` (a rule that asks for a password)
are refused at preflight in one line, exit 2, the host untouched. The users come from `lab up`
(fleetspec.lab.hosts.LAB_USERS); the inventory is this test's own copy of lab.yaml.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.lab import labtools
from tests.lab.labtools import fs
from tests.lab.test_deploy import (  # noqa: F401 (fixture)
    HOST,
    SERVICE,
    STATE,
    ct129,
    snapshot,
    wait_healthy,
)

pytestmark = [pytest.mark.lab, pytest.mark.slow]

DROPIN_DIR = f"/etc/systemd/system/{SERVICE}.d"


def inventory_as(fleet, tmp_path, user: str):
    """lab.yaml with ct129 reached as `user` (become: sudo), key paths made absolute."""
    data = yaml.safe_load((fleet.root / "inventory" / "lab.yaml").read_text())
    for key in ("ssh_key", "known_hosts"):
        data["defaults"][key] = str((fleet.root / "inventory" / data["defaults"][key]).resolve())
    data["hosts"] = {HOST: {**data["hosts"][HOST], "user": user, "become": "sudo"}}
    data["groups"] = {"lab": [HOST]}
    path = tmp_path / f"as-{user}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def as_user(fleet, user: str, script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The machine's ssh client, logged in as `user` (not root) on ct129."""
    from fleetspec.lab import ssh

    argv = ssh.argv(fleet.root, fleet.addresses[HOST])
    argv[-1] = f"{user}@{fleet.addresses[HOST]}"
    return subprocess.run([*argv, "--", script], capture_output=True, text=True, timeout=timeout, check=False)


def owners_and_modes(fleet) -> list[str]:
    """`owner:group mode type path` of what a release made: its folder (release id left out), the
    drop-in folder, the ledger, the baseline and the run folder."""
    out = labtools.sh(fleet, HOST, (
        f"cd {STATE}/current/ && find . -printf '%u:%g %m %y release/%P\\n'; "
        f"find {DROPIN_DIR} {STATE}/ledger.jsonl {STATE}/baseline /var/lib/fleetspec/run -maxdepth 1 "
        f"-printf '%u:%g %m %y %p\\n'"))
    # the smoke's own run files differ between a smoke run and a replayed verdict; not what is compared
    return sorted(line for line in out.splitlines() if "/scratch." not in line and " release/smoke/" not in line)


def ledger_lines(fleet) -> int:
    return len(labtools.ledger(fleet, HOST))


def test_ops_with_passwordless_sudo_deploys_and_rolls_back_as_root_does(lab_fleet, ct129, tmp_path):  # noqa: F811
    ops = inventory_as(lab_fleet, tmp_path, "ops")
    plan = fs(lab_fleet, "-i", ops, "deploy", HOST, "--algo", "ddtree", "--plan", check_rc=0).stdout
    # the NEXTN baseline verified 4 tokens at sglang's default 160; DDTree verifies 65 (the graph rule)
    assert "cuda graph: --cuda-graph-max-bs 160" in plan and "--cuda-graph-max-bs 9" in plan, plan[-3000:]
    fs(lab_fleet, "-i", ops, "deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)
    assert "--cuda-graph-max-bs 9" in labtools.sh(lab_fleet, HOST, f"systemctl show -p ExecStart --value {SERVICE}")
    s = json.loads(fs(lab_fleet, "-i", ops, "status", HOST, "--json", check_rc=0).stdout.strip().splitlines()[-1])
    assert s["served_algo"] == "DDTREE" and s["release_status"] == "healthy", s
    assert snapshot(lab_fleet)["dropins"] == ["zz-fleetspec.conf"]
    as_ops = owners_and_modes(lab_fleet)
    assert as_ops and all(line.startswith("root:root ") for line in as_ops), as_ops
    fs(lab_fleet, "-i", ops, "rollback", HOST, check_rc=0)
    assert snapshot(lab_fleet) == ct129

    fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)   # the same, as root
    assert owners_and_modes(lab_fleet) == as_ops
    r = as_user(lab_fleet, "ops", f"sudo -n sh {STATE}/current/rollback.sh")
    assert r.returncode == 0 and "back on baseline" in r.stdout, (r.stdout, r.stderr)
    assert snapshot(lab_fleet) == ct129
    s = wait_healthy(lab_fleet)
    assert s["algo"] == "NEXTN" and s["drift"] == "pristine", s


@pytest.mark.parametrize("user", ["nosudo", "pwsudo"])
def test_user_whose_sudo_needs_a_password_is_refused_in_one_line(lab_fleet, ct129, tmp_path, user):  # noqa: F811
    assert as_user(lab_fleet, user, "id -un").stdout.strip() == user       # the key works: only sudo fails
    before = ledger_lines(lab_fleet)
    r = fs(lab_fleet, "-i", inventory_as(lab_fleet, tmp_path, user), "deploy", HOST, "--algo", "ddtree", "--yes")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert f"{HOST}: {user}@" in lines[0] and "NOPASSWD" in lines[0] and "password" in lines[0], lines[0]
    assert snapshot(lab_fleet) == ct129 and ledger_lines(lab_fleet) == before

"""Operator views on the lab pair: `status` says loading while a slow model loads (slow_load) and
down when the engine crashes; Ansible INI and YAML inventories drive status, a deploy and a
rollback on the real hosts."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from tests.lab import labtools
from tests.lab.conftest import LAB_HOSTS
from tests.lab.labtools import fs, json_rows, status_rows

pytestmark = [pytest.mark.lab, pytest.mark.slow]

HOST = LAB_HOSTS[1]          # the 0.5.23 host
SERVICE = "sglang-qwen.service"


def row(fleet, *extra):
    return status_rows(fs(fleet, *extra, "status", HOST, "--json"))[-1]     # loading 0, down 3


def restart(fleet):
    labtools.sh(fleet, HOST, f"systemctl restart {SERVICE}")


def test_status_loading_then_down_then_ok(lab_fleet):
    fleet = lab_fleet
    try:
        fs(fleet, "lab", "fault", HOST, "slow_load=45", check_rc=0)
        restart(fleet)
        s = row(fleet)
        assert s["health"] == "loading" and s["state"].startswith("active"), s
        assert any("loading: port not answering yet" in n for n in s["notes"]), s

        fs(fleet, "lab", "fault", HOST, "--clear", check_rc=0)
        fs(fleet, "lab", "fault", HOST, "crash_at_start", check_rc=0)
        restart(fleet)
        deadline = time.monotonic() + 60
        while (s := row(fleet))["health"] != "down":        # it crashes once its argv is parsed
            assert time.monotonic() < deadline, s
            time.sleep(2)
        assert s["health"] == "down", s
    finally:
        fs(fleet, "lab", "fault", HOST, "--clear", check_rc=0)
        restart(fleet)
    w = fs(fleet, "status", HOST, "--watch", "--deadline", "150", "--interval", "2")
    assert w.returncode == 0, w.stdout + w.stderr
    assert f"{HOST} loading" in w.stdout and "all 1 hosts ok" in w.stderr


def _vars(fleet) -> dict:
    from fleetspec.model.inventory import load_inventory

    return load_inventory(fleet.inventory).hosts[HOST]


def test_ansible_inventories_drive_status_deploy_and_rollback(lab_fleet, tmp_path):
    fleet = lab_fleet
    h = _vars(fleet)
    v = h.vars
    key, kh = fleet.root / ".lab" / "ssh" / "id_ed25519", fleet.root / ".lab" / "ssh" / "known_hosts"
    ini = tmp_path / "hosts.ini"
    ini.write_text(textwrap.dedent(f"""\
        [gpu]
        {HOST} ansible_host={h.address} fleetspec_model_path={v.model_path} fleetspec_draft_model_path={v.draft_model_path}

        [gpu:vars]
        ansible_python_interpreter={v.python}
        fleetspec_service={v.service}
        fleetspec_gpu_count={v.gpu_count}

        [lab:children]
        gpu

        [lab:vars]
        ansible_user=root
        ansible_port=22
        ansible_ssh_private_key_file={key}
        fleetspec_known_hosts={kh}
        """))
    (tmp_path / "group_vars").mkdir()         # nested values live in YAML beside the INI, as in Ansible
    (tmp_path / "group_vars" / "lab.yml").write_text(json.dumps({"fleetspec_extra": dict(v.extra)}))
    yml = tmp_path / "yaml" / "hosts.yml"
    yml.parent.mkdir()
    yml.write_text(json.dumps({"lab": {
        "vars": {"ansible_user": "root", "ansible_ssh_private_key_file": str(key), "fleetspec_known_hosts": str(kh),
                 "fleetspec_extra": dict(v.extra)},
        "children": {"gpu": {
            "vars": {"ansible_python_interpreter": v.python, "fleetspec_service": v.service,
                     "fleetspec_gpu_count": v.gpu_count},
            "hosts": {HOST: {"ansible_host": h.address, "ansible_port": 22, "fleetspec_model_path": v.model_path,
                             "fleetspec_draft_model_path": v.draft_model_path}}}}}}))
    for inv in (ini, yml):
        s = row(fleet, "-i", str(inv))
        assert s["reachable"] and s["health"] == "ok" and s["sglang"] == "0.5.23", s
    d = fs(fleet, "-i", str(yml), "deploy", "@gpu", "--algo", "ddtree", "--no-gates", "--yes", "--json")
    assert d.returncode == 0, d.stdout[-2000:] + d.stderr[-2000:]
    out = json_rows(d.stdout)[-1]
    assert out["status"] == "healthy", out
    s = row(fleet, "-i", str(ini))
    assert s["served_algo"] == "DDTREE" and s["release"] == out["release"], s
    fs(fleet, "-i", str(ini), "rollback", HOST, check_rc=0)
    s = row(fleet, "-i", str(ini))
    assert s["release"] is None and s["served_algo"] == "DFLASH" and s["health"] == "ok", s

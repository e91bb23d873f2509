"""Ansible inventories (INI and YAML) resolve to the same Host objects as fleetspec's own format,
drive `status` against real sshds on loopback, and what fleetspec cannot honour is refused in
one line (exit 2)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.errors import UserError
from fleetspec.model.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]


def ini_text(key: Path, kh: Path, port_a: int, port_b: int) -> str:
    return textwrap.dedent(f"""\
        # an operator's Ansible inventory
        bastion.example ansible_host=127.0.0.1 ansible_port={port_b} ansible_user=root

        [gpu]
        ct129 ansible_host=127.0.0.1 ansible_port={port_a} fleetspec_model_path=/root/models/Qwen3.6-27B
        ct200 ansible_host=127.0.0.1 ansible_port={port_b} fleetspec_gpu_count=2

        [gpu:vars]
        ansible_python_interpreter=/root/ml-env/bin/python3
        fleetspec_service=sglang-qwen.service

        [fleet:children]
        gpu

        [fleet:vars]
        fleetspec_service=sglang.service
        fleetspec_ready_timeout=600

        [all:vars]
        ansible_user=root
        ansible_ssh_private_key_file={key}
        fleetspec_known_hosts={kh}
        fleetspec_connect_timeout=3
        """)


def yaml_text(key: Path, kh: Path, port_a: int, port_b: int) -> str:
    return textwrap.dedent(f"""\
        all:
          vars:
            ansible_user: root
            ansible_ssh_private_key_file: {key}
            fleetspec_known_hosts: {kh}
            fleetspec_connect_timeout: 3
          hosts:
            bastion.example: {{ansible_host: 127.0.0.1, ansible_port: {port_b}, ansible_user: root}}
          children:
            fleet:
              vars: {{fleetspec_service: sglang.service, fleetspec_ready_timeout: 600}}
              children:
                gpu:
                  vars:
                    ansible_python_interpreter: /root/ml-env/bin/python3
                    fleetspec_service: sglang-qwen.service
                  hosts:
                    ct129: {{ansible_host: 127.0.0.1, ansible_port: {port_a}, fleetspec_model_path: /root/models/Qwen3.6-27B}}
                    ct200: {{ansible_host: 127.0.0.1, ansible_port: {port_b}, fleetspec_gpu_count: 2}}
        """)


def native_text(key: Path, kh: Path, port_a: int, port_b: int) -> str:
    return textwrap.dedent(f"""\
        defaults: {{user: root, ssh_key: {key}, known_hosts: {kh}, connect_timeout: 3}}
        groups:
          fleet: [ct129, ct200]
          gpu: [ct129, ct200]
        hosts:
          bastion.example: {{address: 127.0.0.1, port: {port_b}}}
          ct129:
            address: 127.0.0.1
            port: {port_a}
            vars: {{python: /root/ml-env/bin/python3, service: sglang-qwen.service,
                   model_path: /root/models/Qwen3.6-27B, extra: {{ready_timeout: 600}}}}
          ct200:
            address: 127.0.0.1
            port: {port_b}
            vars: {{python: /root/ml-env/bin/python3, service: sglang-qwen.service, gpu_count: 2,
                   extra: {{ready_timeout: 600}}}}
        """)


def same(a, b):
    strip = lambda inv: {n: dataclasses.replace(h, inventory_path=None) for n, h in inv.hosts.items()}
    assert strip(a) == strip(b)
    for n in a.hosts:            # Host.__eq__ covers vars only by hash; compare them field by field
        assert a.hosts[n].vars == b.hosts[n].vars and dict(a.hosts[n].vars.extra) == dict(b.hosts[n].vars.extra), n
        assert a.hosts[n].groups == b.hosts[n].groups, n
    assert dict(a.groups) == dict(b.groups)


@pytest.mark.parametrize("fmt", ["ini", "yaml"])
def test_ansible_resolves_to_the_native_hosts(tmp_path, ssh_client_key, fmt):
    kh = tmp_path / "known_hosts"
    native = tmp_path / "native.yaml"
    native.write_text(native_text(ssh_client_key, kh, 2201, 2202))
    path = tmp_path / ("hosts.ini" if fmt == "ini" else "hosts.yml")
    path.write_text((ini_text if fmt == "ini" else yaml_text)(ssh_client_key, kh, 2201, 2202))
    got, want = load_inventory(path), load_inventory(native)
    same(got, want)
    assert list(got.hosts) == ["bastion.example", "ct129", "ct200"]
    assert got.hosts["ct129"].vars.service == "sglang-qwen.service"     # the child group wins over its parent
    assert got.hosts["bastion.example"].vars.service == "sglang.service"  # the default: in no group


def test_group_vars_and_host_vars_folders_and_overlay(tmp_path, ssh_client_key):
    kh = tmp_path / "known_hosts"
    (tmp_path / "hosts.ini").write_text(ini_text(ssh_client_key, kh, 2201, 2202))
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text("fleetspec_api_port: 31000\nfleetspec_tags: [hybrid]\n")
    (tmp_path / "group_vars" / "all").mkdir()
    (tmp_path / "group_vars" / "all" / "ssh.yaml").write_text("fleetspec_command_timeout: 120\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "ct200.yaml").write_text("fleetspec_service: sglang-b.service\nansible_port: 2299\n")
    inv = load_inventory(tmp_path / "hosts.ini")
    a, b = inv.hosts["ct129"], inv.hosts["ct200"]
    assert a.vars.api_port == 31000 and a.vars.tags == ("hybrid",) and a.command_timeout == 120
    assert b.vars.service == "sglang-b.service" and b.port == 2299          # host_vars/ wins over inline
    # The overlay: fleetspec's own names, above every Ansible var.
    (tmp_path / "hosts.fleetspec.yaml").write_text(textwrap.dedent("""\
        defaults: {host_key_policy: accept-new}
        vars: {draft_model_path: /root/models/draft}
        group_vars: {gpu: {api_key: {secret_env: SGLANG_API_KEY}}}
        host_vars: {ct129: {service: sglang-overlay.service, extra: {keep_releases: 5}}}
        """))
    inv = load_inventory(tmp_path / "hosts.ini")
    a = inv.hosts["ct129"]
    assert a.vars.service == "sglang-overlay.service" and a.vars.draft_model_path == "/root/models/draft"
    assert a.vars.api_key.env == "SGLANG_API_KEY" and a.host_key_policy == "accept-new"
    assert dict(a.vars.extra) == {"ready_timeout": 600, "keep_releases": 5}


def test_status_through_ansible_inventories(sshd_factory, tmp_path, ssh_client_key):
    a, b = sshd_factory(), sshd_factory()
    kh = tmp_path / "known_hosts"
    kh.write_text(a.known_hosts_line + b.known_hosts_line)
    root = tmp_path / "root"
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir(parents=True)
    for name, text in (("hosts.ini", ini_text), ("hosts.yml", yaml_text)):
        path = tmp_path / name
        path.write_text(text(ssh_client_key, kh, a.port, b.port).replace("/root/ml-env/bin/python3", sys.executable))
        r = CliRunner().invoke(main, ["--root", str(root), "-i", str(path), "status", "@gpu", "--json"])
        assert r.exit_code == 0, r.output
        rows = [json.loads(ln) for ln in r.output.splitlines()]
        assert [(x["host"], x["reachable"], x["address"]) for x in rows] == \
            [("ct129", True, f"127.0.0.1:{a.port}"), ("ct200", True, f"127.0.0.1:{b.port}")], rows
        assert rows[0]["service"] == "sglang-qwen.service" and rows[0]["health"] == "down"


def cli(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetspec", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "100"})


def test_inventory_show_redacts(tmp_path, ssh_client_key, monkeypatch):
    root = tmp_path / "root"
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir(parents=True)
    path = tmp_path / "hosts.ini"
    path.write_text(ini_text(ssh_client_key, tmp_path / "kh", 2201, 2202)
                    + "ansible_password=hunter2-secret\nfleetspec_api_key_env=OPX_TEST_KEY\n")
    monkeypatch.setenv("OPX_TEST_KEY", "sk-very-secret-value")      # the child process inherits it
    r = cli("--root", str(root), "-i", str(path), "inventory", "show")
    assert r.returncode == 0, r.stderr
    assert "hunter2" not in r.stdout and "sk-very-secret-value" not in r.stdout
    assert "from $OPX_TEST_KEY (set; value redacted)" in r.stdout
    assert "not used (fleetspec connects with keys only; values not shown): ansible_password" in r.stdout
    assert f"{path} (Ansible INI inventory): 3 hosts, groups: @fleet, @gpu" in r.stdout
    assert "port: 2201" in r.stdout and "service: sglang-qwen.service" in r.stdout


@pytest.mark.parametrize("name, text, mode, says", [
    ("dyn.py", "#!/usr/bin/env python3\nprint('{}')\n", 0o755, "a dynamic Ansible inventory (an executable script) is not supported"),
    ("v.yml", "all:\n  hosts:\n    ct129:\n      ansible_password: !vault |\n          $ANSIBLE_VAULT;1.1;AES256\n          6638\n",
     0o644, "host ct129.ansible_password is vault-encrypted"),
    ("v.ini", "[gpu]\nct129\n[gpu:vars]\nfleetspec_service=$ANSIBLE_VAULT;1.1;AES256\n", 0o644,
     "group gpu.fleetspec_service is vault-encrypted"),
    ("whole.yml", "$ANSIBLE_VAULT;1.1;AES256\n6638643965\n", 0o644, "vault-encrypted file"),
    ("t.ini", "[gpu]\nct129 ansible_host=\"{{ lookup('env', 'X') }}\"\n", 0o644, "is a Jinja template"),
    ("r.ini", "[gpu]\nct[129:140]\n", 0o644, "host ranges like 'ct[129:140]' are not supported"),
    ("c.ini", "[gpu]\nct129 ansible_connection=docker\n", 0o644, "ansible_connection=docker is not supported"),
    ("p.ini", "[gpu:vars]\nansible_ssh_common_args='-o ProxyCommand=\"nc %h %p\"'\n[gpu]\nct129\n", 0o644,
     "ProxyCommand in ansible_ssh_common_args is not supported"),
])
def test_refused_in_one_line(tmp_path, name, text, mode, says):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(UserError) as err:
        load_inventory(path)
    assert says in str(err.value) and "\n" not in str(err.value)
    root = tmp_path / "root"
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir(parents=True)
    r = CliRunner().invoke(main, ["--root", str(root), "-i", str(path), "inventory", "show"])
    assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_proxy_jump_becomes_the_jump_host(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text("[gpu]\nct129 ansible_host=ct129.gpu.example\n[gpu:vars]\n"
                    "ansible_ssh_common_args='-o ProxyJump=ops@bastion.example:2222'\n")
    jump = load_inventory(path).hosts["ct129"].jump
    assert (jump.user, jump.address, jump.port) == ("ops", "bastion.example", 2222)


def test_native_inventories_are_untouched(tmp_path, ssh_client_key):
    """A native inventory that happens to be executable is still read as fleetspec's own."""
    path = tmp_path / "inv.yaml"
    path.write_text(native_text(ssh_client_key, tmp_path / "kh", 2201, 2202))
    path.chmod(0o755)
    assert list(load_inventory(path).hosts) == ["bastion.example", "ct129", "ct200"]

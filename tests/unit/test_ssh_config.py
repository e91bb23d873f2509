"""~/.ssh/config as OpenSSH reads it (remote/ssh_config.py): a Host alias with HostName, Port, User,
IdentityFile and ProxyJump through a second real sshd acting as the jump host, `fleetspec status
ALIAS` through it (commands and HTTP), the inventory's own values winning, and what applied in -v."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetspec.errors import ConfigError
from fleetspec.model.inventory import load_inventory
from fleetspec.remote.ssh_config import reach


def _write_config(home: Path, target, jump, key: Path) -> None:
    (home / ".ssh").mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / ".ssh" / "jumps.conf").write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {jump.port}\n  User root\n  IdentityFile {key}\n")
    (home / ".ssh" / "config").write_text(
        "Include jumps.conf\n"
        f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {target.port}\n  User root\n  IdentityFile {key}\n"
        "  ProxyJump jumpbox\n"
        "Host *\n  User nobody-by-default\n")


@pytest.fixture
def fleet(tmp_path, sshd_factory, ssh_client_key, fake_sglang):
    """A fleet root whose inventory names only `gpu-alias`: how to reach it is ~/.ssh/config's."""
    target, jump = sshd_factory(), sshd_factory()
    home = tmp_path / "home"
    _write_config(home, target, jump, ssh_client_key)
    root = tmp_path / "root"
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir(parents=True)
    kh = root / "known_hosts"
    kh.write_text(target.known_hosts_line + jump.known_hosts_line)
    (root / "inventory" / "lab.yaml").write_text(
        f"defaults:\n  known_hosts: {kh}\n  connect_timeout: 3\n"
        f"  vars: {{python: {sys.executable}, service: sglang-test.service, api_port: {fake_sglang}}}\n"
        "hosts:\n  gpu-alias: {}\n")
    yield root, home, target, jump
    jump.stop()


def _status(root: Path, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, "-m", "fleetspec", "-v", "--root", str(root), "status", "gpu-alias",
                           "--json"], capture_output=True, text=True, timeout=120, env=env, cwd=root)


def test_status_of_an_alias_goes_through_its_proxyjump(fleet):
    root, home, target, jump = fleet
    done = _status(root, home)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.splitlines()[-1])
    assert row["reachable"] is True and row["algo"] == "NEXTN", row       # a command and HTTP, both via the jump
    route = f"ssh root@127.0.0.1:{target.port} via root@127.0.0.1:{jump.port}"
    said = [line for line in done.stderr.splitlines() if route in line]
    assert said and "hostname 127.0.0.1" in said[0] and f"port {target.port}" in said[0], done.stderr
    assert "proxyjump jumpbox" in said[0] and str(home / ".ssh" / "config") in said[0]
    jump.stop()                                                            # the route really is the jump's
    row = json.loads(_status(root, home).stdout.splitlines()[-1])
    assert row["reachable"] is False and f"127.0.0.1:{jump.port}" in row["error"], row


def _host(tmp_path: Path, config: str, entry: str = "{}", defaults: str = ""):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(config)
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"defaults:\n  ssh_config: {cfg}\n{defaults}hosts:\n  gpu: {entry}\n")
    return load_inventory(inv).hosts["gpu"]


CONFIG = ("Host gpu\n  HostName gpu.internal.example\n  Port 2222\n  User ops\n  ProxyJump admin@bastion:2200,inner\n"
          "Host inner\n  HostName inner.internal.example\n")


def test_the_inventorys_own_values_win_and_are_said(tmp_path):
    r = reach(_host(tmp_path, CONFIG))
    assert (r.target.address, r.target.port, r.target.user) == ("gpu.internal.example", 2222, "ops")
    assert [(j.address, j.port, j.user) for j in r.jumps] == [("bastion", 2200, "admin"), ("inner.internal.example", 22, "ops")]
    r = reach(_host(tmp_path, CONFIG, "{port: 22, user: root, jump: 'bastion2'}"))
    assert (r.target.address, r.target.port, r.target.user) == ("gpu.internal.example", 22, "root")
    assert [j.address for j in r.jumps] == ["bastion2"] and set(r.kept) == {"port", "user", "jump"}
    assert r.applied == ("hostname gpu.internal.example",)
    r = reach(_host(tmp_path, CONFIG, defaults="  user: deploy\n"))       # defaults are the inventory's too
    assert r.target.user == "deploy" and "user" in r.kept
    assert reach(_host(tmp_path, CONFIG, "{address: other}")).target.address == "other"


def test_without_a_config_or_with_none_the_inventory_alone_decides(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("defaults:\n  ssh_config: none\nhosts:\n  gpu: {address: gpu1.example, port: 2022}\n")
    r = reach(load_inventory(inv).hosts["gpu"])
    assert (r.target.address, r.target.port, r.target.user, r.jumps, r.config) == ("gpu1.example", 2022, "root", (), None)


def test_match_exec_and_a_jump_loop_are_one_line_refusals(tmp_path):
    with pytest.raises(ConfigError, match="Match exec"):
        reach(_host(tmp_path, "Match exec \"true\"\n  Port 2\n"))
    with pytest.raises(ConfigError, match="ProxyJump: .*at most 8 hops"):
        reach(_host(tmp_path, "Host gpu\n  ProxyJump a\nHost a\n  ProxyJump b\nHost b\n  ProxyJump a\n"))

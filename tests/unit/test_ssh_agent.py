"""A passphrase-protected key held by a real ssh-agent, against a real sshd (remote/hostkeys.py):
fleetspec logs in as `ssh -i KEY` does, through the agent's key with the file's public half (it
raised `TypeError: Key is password-protected` before); without the agent's copy the key is one line."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.errors import RemoteError
from fleetspec.model.inventory import load_inventory
from fleetspec.remote.transport import Transport
from tests.conftest import Sshd, free_port

PASSPHRASE = "correct horse battery staple"


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """A real ssh-agent on its own socket, ended by its pid."""
    work = tmp_path_factory.mktemp("agent")
    sock = work / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not sock.exists():
        assert proc.poll() is None, "ssh-agent exited"
        time.sleep(0.05)
    yield sock
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)


def ssh_add(sock: Path, *args: str) -> None:
    askpass = sock.parent / "askpass"
    askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
    askpass.chmod(0o700)
    env = dict(os.environ, SSH_AUTH_SOCK=str(sock), SSH_ASKPASS=str(askpass), SSH_ASKPASS_REQUIRE="force",
               DISPLAY=":0")
    subprocess.run(["ssh-add", "-q", *args], check=True, env=env, stdin=subprocess.DEVNULL, capture_output=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("enc")
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-C", "enc", "-f", str(key)], check=True,
                   stdin=subprocess.DEVNULL)
    sshd = Sshd(work / "sshd", free_port(), key).start()
    yield sshd, key
    sshd.stop()


@pytest.fixture
def root(tmp_path, server):
    sshd, key = server
    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    (tmp_path / "known_hosts").write_text(sshd.known_hosts_line)
    (tmp_path / "inventory" / "lab.yaml").write_text(
        f"defaults: {{ssh_key: {key}, known_hosts: {tmp_path / 'known_hosts'}, connect_timeout: 5}}\n"
        f"hosts:\n  h: {{address: 127.0.0.1, port: {sshd.port}}}\n")
    return tmp_path


def host_of(root):
    return load_inventory(root / "inventory" / "lab.yaml").hosts["h"]


def test_an_encrypted_key_in_the_agent_logs_in_as_ssh_does(root, server, agent, monkeypatch):
    sshd, key = server
    ssh_add(agent, str(key))
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent))
    ssh = subprocess.run(["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={root / 'known_hosts'}",
                          "-p", str(sshd.port), "root@127.0.0.1", "true"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=60)
    assert ssh.returncode == 0, ssh.stderr                          # what OpenSSH does with the same files
    t = Transport(host_of(root))
    try:
        assert t.run(["true"], timeout=20).ok
    finally:
        t.close()
    pub = Path(f"{key}.pub")                                        # without .pub: the key file's own public half
    saved = pub.read_bytes()
    pub.unlink()
    try:
        t = Transport(host_of(root))
        assert t.run(["true"], timeout=20).ok
        t.close()
    finally:
        pub.write_bytes(saved)


def test_an_encrypted_key_without_the_agents_copy_is_one_line(root, server, agent, monkeypatch):
    sshd, key = server
    ssh_add(agent, "-D")                                            # the agent forgets every key
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent))
    with pytest.raises(RemoteError, match=rf"h: ssh key {key} has a passphrase and ssh-agent holds no keys: "
                                          rf"run `ssh-add {key}`"):
        Transport(host_of(root)).run(["true"])
    monkeypatch.delenv("SSH_AUTH_SOCK")
    r = CliRunner().invoke(main, ["--root", str(root), "status", "h", "--json"])
    assert "has a passphrase and no ssh-agent is running" in r.output and "Traceback" not in r.output, r.output
    assert r.exit_code != 0

"""known_hosts lines with `@revoked` or `@cert-authority` (remote/hostkeys.py, model/known_hosts.py)
against a real sshd: paramiko's own reader ended in an InvalidHostKey traceback on either. A
revoked key is refused in one line under every policy; a host known only through a CA line is
refused saying why; a CA line beside the host's own key line changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.model import known_hosts
from fleetspec.model.inventory import load_inventory
from fleetspec.remote.hostkeys import HostKeyError
from fleetspec.remote.transport import Transport

CA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def _host(tmp_path, inventory_writer, sshd, key, kh: Path, policy="strict"):
    path = inventory_writer(tmp_path / "inventory" / "lab.yaml", {"h": sshd}, key, known_hosts=kh, trust=False,
                            policy=policy)
    return load_inventory(path).hosts["h"]


@pytest.fixture
def root(tmp_path):
    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    return tmp_path


def test_a_revoked_host_key_is_refused_in_one_line(root, inventory_writer, sshd, ssh_client_key):
    kh = root / "known_hosts"
    pub = Path(f"{sshd.host_key}.pub").read_text().split()
    kh.write_text(sshd.known_hosts_line + f"@revoked * {pub[0]} {pub[1]}\n")
    assert known_hosts.problem(kh) is None
    for policy in ("strict", "accept-new"):
        host = _host(root, inventory_writer, sshd, ssh_client_key, kh, policy)
        with pytest.raises(HostKeyError, match=r"is marked @revoked in .*known_hosts line 2; refusing"):
            Transport(host).run(["true"])
    assert kh.read_text().count("\n") == 2                       # nothing recorded
    r = CliRunner().invoke(main, ["--root", str(root), "status", "h", "--json"])
    assert r.exit_code == 4 and "@revoked" in r.output and "Traceback" not in r.output, r.output


def test_a_host_known_only_through_a_ca_is_refused_saying_why(root, inventory_writer, sshd, ssh_client_key):
    kh = root / "known_hosts"
    kh.write_text(f"@cert-authority [127.0.0.1]:* {CA}\n")
    host = _host(root, inventory_writer, sshd, ssh_client_key, kh)
    with pytest.raises(HostKeyError) as err:
        Transport(host).run(["true"])
    text = str(err.value)
    assert "only through @cert-authority (line 1)" in text and "not host certificates" in text, text
    assert f"ssh-keyscan -t ssh-ed25519 -p {sshd.port} 127.0.0.1" in text and "\n" not in text
    kh.write_text(f"@cert-authority [127.0.0.1]:* {CA}\n" + sshd.known_hosts_line)    # the host's own line too
    t = Transport(host)
    try:
        assert t.run(["true"], timeout=20).ok
    finally:
        t.close()


def test_host_patterns_of_marked_lines():
    assert known_hosts.host_matches("[127.0.0.1]:*", "[127.0.0.1]:2222")
    assert known_hosts.host_matches("*.example,!bad.example", "gpu.example")
    assert not known_hosts.host_matches("*.example,!bad.example", "bad.example")
    assert not known_hosts.host_matches("gpu.example", "other.example")
    import paramiko

    hashed = paramiko.HostKeys.hash_host("gpu.example")
    assert known_hosts.host_matches(hashed, "gpu.example") and not known_hosts.host_matches(hashed, "x.example")

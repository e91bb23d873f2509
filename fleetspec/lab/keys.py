"""The lab's SSH material in `<root>/.lab/ssh/`: the client key, one host key per host (kept
across up/down so known_hosts stays valid), and known_hosts for strict checking."""

from __future__ import annotations

import subprocess
from pathlib import Path


def ssh_dir(root: Path) -> Path:
    return root / ".lab" / "ssh"


def client_key(root: Path) -> Path:
    key = ssh_dir(root) / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleetspec-lab",
                        "-f", str(key)], check=True)
    return key


def host_key(root: Path, name: str) -> Path:
    key = ssh_dir(root) / "hosts" / name / "ssh_host_ed25519_key"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}",
                        "-f", str(key)], check=True)
    return key


def write_known_hosts(root: Path, addresses: dict[str, str]) -> Path:
    """One line per host: its address and its name, so either may be used to connect."""
    lines = []
    for name, addr in sorted(addresses.items()):
        kind, blob = (host_key(root, name).with_suffix(".pub").read_text().split()[:2])
        lines.append(f"{addr},{name} {kind} {blob}")
    path = ssh_dir(root) / "known_hosts"
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    return path

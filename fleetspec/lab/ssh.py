"""Running commands on lab hosts with the machine's ssh client (the lab's own plumbing; fleetspec
proper talks to hosts through fleetspec.remote.transport)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path


def argv(root: Path, address: str, timeout: int = 5) -> list[str]:
    d = root / ".lab" / "ssh"
    return ["ssh", "-i", str(d / "id_ed25519"), "-o", f"UserKnownHostsFile={d / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}",
            "-o", "LogLevel=ERROR", "-F", "/dev/null", f"root@{address}"]


BANNER_TIMEOUT = b"Connection timed out during banner exchange"


def run(root: Path, address: str, script: str, timeout: float = 60, input: bytes | None = None,
        check: bool = False) -> subprocess.CompletedProcess:
    """Run a shell string (built with shlex.quote) on the host. A connection whose sshd did not
    greet within ConnectTimeout (a host busy restarting its engine on a loaded machine) is tried
    once more: nothing ran on the host, so the retry is safe."""
    cmd = [*argv(root, address), "--", "sh", "-c", shlex.quote(script)]
    r = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
    if r.returncode == 255 and BANNER_TIMEOUT in r.stderr:
        r = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
    if check:
        r.check_returncode()
    return r

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


def run(root: Path, address: str, script: str, timeout: float = 60, input: bytes | None = None,
        check: bool = False) -> subprocess.CompletedProcess:
    """Run a shell string (built with shlex.quote) on the host."""
    return subprocess.run([*argv(root, address), "--", "sh", "-c", shlex.quote(script)],
                          input=input, capture_output=True, timeout=timeout, check=check)

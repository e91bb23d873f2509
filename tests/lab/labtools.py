"""Helpers the end-to-end tests share: the real CLI in a child process, shell on a lab host."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def fs(fleet, *args, timeout=900, env=None, check_rc=None):
    """Run the real CLI as an operator would; returns CompletedProcess (text)."""
    cmd = [sys.executable, "-m", "fleetspec", "--root", str(fleet.root), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if check_rc is not None:
        assert r.returncode == check_rc, f"{' '.join(args)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def sh(fleet, host, script, timeout=60) -> str:
    r = fleet.run(host, script, timeout=timeout)
    assert r.returncode == 0, (script, r.stdout, r.stderr)
    return r.stdout.decode()


def ledger(fleet, host, service="sglang-qwen") -> list[dict]:
    text = fleet.run(host, f"cat /var/lib/fleetspec/{service}/ledger.jsonl 2>/dev/null").stdout.decode()
    return [entry for entry in map(_entry, text.splitlines()) if entry is not None]


def _entry(line: str) -> dict | None:
    """A ledger line, or None for a blank or torn one (a crash or ENOSPC mid-append, which an
    earlier test may have left on purpose); fleetspec's own parser skips those too."""
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None


def json_rows(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def status_rows(r) -> list[dict]:
    """`status --json`'s rows, its exit code checked against them as the exit-code table says:
    4 a host unreachable, 3 one down or unhealthy, else 0 (a host loading is on its way)."""
    rows = json_rows(r.stdout)
    want = 4 if any(not x["reachable"] for x in rows) else \
        3 if any(x["health"] in ("down", "unhealthy") for x in rows) else 0
    assert rows and r.returncode == want, f"status -> {r.returncode}, expected {want}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return rows

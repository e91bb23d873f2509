"""Where a symlink points ("" when it is not one or does not exist), as files.readlink reads it,
for a batch (prune reads `current` with the ledger in one round trip)."""

from __future__ import annotations

import shlex


def command(path: str) -> str:
    return f"readlink -- {shlex.quote(path)} || true"


def parse(stdout: str, path: str = "") -> str:
    return stdout.removesuffix("\n")

"""The benches' figures as JSON files under bench/results/, which bench/plots.py draws and the
docs quote: one file per measurement, replaced by the next run of the command it names.

Each file is one JSON object: `meta` (date, commit, the command that made it, the machine, and
`stand_in`: true when the figures come from the lab's engine stand-in, never a GPU) and the
bench's own figures beside it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def meta(stand_in: bool = True, **extra) -> dict:
    """Where and when these figures were made, and how to make them again."""
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    argv = [Path(sys.argv[0]).resolve().relative_to(ROOT).as_posix() if Path(sys.argv[0]).resolve().is_relative_to(ROOT)
            else sys.argv[0], *sys.argv[1:]]
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit,
            "command": "python3 " + " ".join(argv),
            "machine": f"{len(os.sched_getaffinity(0))} cores, {platform.system()} {platform.release()}",
            "stand_in": stand_in, **extra}


def write(path: Path, figures: dict, stand_in: bool = True, **extra) -> None:
    """`figures` with its `meta`, written whole (temp file, then rename)."""
    doc = {"meta": meta(stand_in, **extra), **figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
    print(f"wrote {path}", file=sys.stderr)


def read(path: Path) -> dict:
    return json.loads(path.read_text())

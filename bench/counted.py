"""Run the fleetspec CLI with an observer on every remote action, for the benches.

    FLEETSPEC_BENCH_COUNTS=out.json python3 bench/counted.py --root R deploy …

At exit, out.json holds per host the SSH commands run (exec channels), SFTP transfers and HTTP
requests (direct-tcpip channels), and each command's first words, so a bench can print how many
round trips one deploy costs (transport.add_observer sees every one).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetspec.remote import transport


def precompile() -> None:
    """fleetspec's byte-code compiled once, as `pip install` leaves it: this dev machine sets
    PYTHONDONTWRITEBYTECODE, which would charge every measured run the compile of fleetspec's own
    modules (~0.2 s of client CPU per process) that no operator's run pays. Stale files are
    recompiled here; a run reads them whatever that variable says."""
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "fleetspec"), quiet=1)


COUNTS: dict = defaultdict(lambda: {"commands": 0, "sftp": 0, "http": 0, "command_list": []})


def kind(what: str) -> str:
    if what.startswith(("put ", "get ")):
        return "sftp"
    if what.split(" ", 1)[0] in ("GET", "POST", "PUT", "DELETE") and " http://" in what:
        return "http"
    return "commands"


def observe(host: str, what: str, seconds: float, outcome: str) -> None:
    k = kind(what)
    COUNTS[host][k] += 1
    if k == "commands":
        COUNTS[host]["command_list"].append(what[:100])


def dump() -> None:
    out = os.environ.get("FLEETSPEC_BENCH_COUNTS")
    if out:
        Path(out).write_text(json.dumps(COUNTS, indent=1))


if __name__ == "__main__":
    transport.add_observer(observe)
    atexit.register(dump)
    from fleetspec.cli import main

    main()

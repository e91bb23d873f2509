"""The lab's knobs on a host: engine timing (/etc/fleetspec-lab/engine.json) and faults
(/etc/fleetspec-lab/faults.json, written by `fleetspec lab fault`; read at start and per request).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

ETC = Path(os.environ.get("FLEETSPEC_LAB_ETC", "/etc/fleetspec-lab"))

ENGINE_DEFAULTS = {
    "load_seconds": 1.0,      # model load after parsing (slow_load overrides)
    "warmup_seconds": 0.5,    # between the HTTP server coming up and /ready = 200
    "step_seconds": 0.02,     # one target forward over one token (decode.py's cost model)
    "verify_node_cost": 0.01,  # each verified node beyond the first, in step_seconds
    "draft_token_cost": 0.01,  # each drafted position, in step_seconds (same for every algorithm)
    "drain_seconds": 30.0,    # SIGTERM waits at most this long for in-flight requests
    "thin_step_seconds": 0.0,  # the thin stand-in's pace per token (0: it answers at once)
    "graph_miss_factor": 3.0,  # a step with more requests running than the CUDA graph holds (decode.py)
    "vocab": 64,
}


def _read(name: str) -> dict:
    try:
        data = json.loads((ETC / name).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        print(f"fleetspec-lab: ignoring unreadable {ETC / name}: {err}", flush=True)
        return {}
    return data if isinstance(data, dict) else {}


def wait_stop(stop: threading.Event, seconds: float | None = None) -> bool:
    """Event.wait in short slices: the kernel may hand SIGTERM to any thread, and CPython runs the
    handler only when the main thread next runs bytecode, which a bare wait() would never do."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while not stop.is_set():
        left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
        if left <= 0:
            break
        stop.wait(left)
    return stop.is_set()


def engine() -> dict:
    return {**ENGINE_DEFAULTS, **_read("engine.json")}


# The resolved algorithm of this engine, set by main once argv is parsed: a fault written with
# only_algorithm=NAME bites only an engine serving NAME (so a deploy's new release breaks while
# the previous good state it reverts to stays healthy, as with a real bad patch).
ALGORITHM: str | None = None


def faults() -> dict:
    """{kind: value}; value is True for flag kinds. {} when scoped to another algorithm."""
    data = _read("faults.json")
    only = data.get("only_algorithm")
    if only and str(only).upper() != str(ALGORITHM or "NONE").upper():
        return {}
    return data


def log_xid(code: int) -> str | None:
    """Append an Xid line for GPU 0 to the lab's kernel log (ETC/gpu/kernel.log, which the lab's
    journalctl prints for -k), as the driver logs one when a GPU fails under a starting engine.
    Returns the line, None without the GPU stand-in (no fixture tables)."""
    import time

    folder = ETC / "gpu"
    try:
        header, first = (folder / "query-gpu.csv").read_text().splitlines()[:2]
    except (OSError, ValueError):
        return None
    names = [h.strip().split(" [")[0] for h in header.split(",")]
    bus = [c.strip() for c in first.split(",")][names.index("pci.bus_id")]
    domain, rest = bus.split(":", 1)
    pci = f"{int(domain, 16):04x}:{rest.rsplit('.', 1)[0].lower()}"
    line = f"NVRM: Xid (PCI:{pci}): {code}, pid={os.getpid()}, name=python3, fleetspec-lab fault xid_at_start"
    with open(folder / "kernel.log", "a") as fh:
        fh.write(f"{time.time():.6f} {line}\n")
    return line


def bite_at_start(faults: dict, log) -> None:
    """The faults that bite before the model load: xid_at_start logs the Xid for GPU 0 (log_xid),
    crash_at_start exits 1 as a CUDA error does."""
    if faults.get("xid_at_start"):
        log.error("GPU fault: %s", log_xid(int(faults["xid_at_start"])) or "no GPU stand-in (lab fault gpu=…)")
    if faults.get("crash_at_start"):
        log.error("RuntimeError: CUDA error: an illegal memory access was encountered "
                  "(fleetspec-lab fault crash_at_start)")
        sys.exit(1)

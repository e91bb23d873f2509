"""`lab fault HOST KIND[=VALUE]…`: break a lab host on purpose, over SSH, the way hosts break.

Faults live in /etc/fleetspec-lab/faults.json on the host; the engine stand-in reads it at start
(crash_at_start, hang_at_start, slow_load) and per request (the rest), so start-time faults bite
at the next (re)start of the service. gpu=CASE gives the host an nvidia-smi stand-in and a kernel
log from a fixture case (lab/gpu.py); --clear removes them. disk_full is real: /var/lib/fleetspec is overlaid with a full
tmpfs as its writable layer, so it reads as before and writes there fail with ENOSPC; --clear
takes the overlay away (nothing is copied either way).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from fleetspec.errors import UserError
from fleetspec.lab import gpu, lab, ssh

FAULTS = "/etc/fleetspec-lab/faults.json"
KINDS = {  # kind -> value type (None: a flag)
    "crash_at_start": None, "hang_at_start": None, "garbage_output": None, "disk_full": None,
    "health_503_after": float, "slow_tokens": float, "slow_load": float, "wrong_algorithm": str,
    "fail_requests_after": float,   # /generate answers 500 once the engine has served this many requests
    "only_algorithm": str,   # a modifier: the faults bite only an engine serving this algorithm
    "gpu": str,              # a fixture case for the nvidia-smi stand-in (lab/gpu.py): h200x2, ecc, …
    "xid_at_start": int,     # the engine logs this Xid for GPU 0 at start (needs gpu=…)
}
DISK = "/var/lib/fleetspec"
DISK_LOWER = "/run/fleetspec-lab/disk-lower"
DISK_UPPER = "/run/fleetspec-lab/disk-full"


def parse(specs) -> dict:
    out: dict[str, str | float | bool] = {}
    for spec in specs:
        kind, eq, raw = spec.partition("=")
        kind = kind.strip().replace("-", "_")
        if kind not in KINDS:
            raise UserError(f"unknown fault {kind!r}; known: {', '.join(sorted(KINDS))}")
        typ = KINDS[kind]
        if typ is None:
            if eq:
                raise UserError(f"fault {kind} takes no value")
            out[kind] = True
            continue
        if not eq or not raw:
            raise UserError(f"fault {kind} needs a value: {kind}=VALUE")
        try:
            value: str | float = typ(raw)
        except ValueError:
            raise UserError(f"fault {kind}={raw}: expected a number") from None
        if isinstance(value, float) and value < 0:
            raise UserError(f"fault {kind}={raw}: must not be negative")
        if kind == "gpu":
            gpu.check_case(str(value))
        if kind == "slow_tokens" and isinstance(value, float) and value < 1:
            raise UserError(f"fault slow_tokens={raw}: a factor of 1 or more (tokens/s is divided by it)")
        out[kind] = value
    return out


def _current(root: Path, address: str) -> dict:
    r = ssh.run(root, address, f"cat {shlex.quote(FAULTS)} 2>/dev/null || true", timeout=15)
    try:
        data = json.loads(r.stdout or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _write_script(faults: dict) -> str:
    body = json.dumps(faults, indent=1, sort_keys=True) + "\n"
    tmp = FAULTS + ".tmp"
    return (f"mkdir -p {shlex.quote(str(Path(FAULTS).parent))} && printf %s {shlex.quote(body)} > {shlex.quote(tmp)}"
            f" && mv {shlex.quote(tmp)} {shlex.quote(FAULTS)}")


def _disk_script(*steps: str) -> str:
    """`set -e` and the steps, with {d}, {lo} and {t} the quoted folders of the disk-full overlay."""
    folders = {"d": shlex.quote(DISK), "lo": shlex.quote(DISK_LOWER), "t": shlex.quote(DISK_UPPER)}
    return "\n".join(["set -e", *(step.format(**folders) for step in steps)])


def disk_full_script() -> str:
    """/var/lib/fleetspec becomes an overlay whose writable layer is a full tmpfs: everything reads
    as before, every write fails with ENOSPC. Nothing is copied (a state folder of many releases
    took minutes to copy in and out, and a clear cut short by its timeout lost it all)."""
    return _disk_script(
        "mountpoint -q {d} && exit 0",
        "mkdir -p {d} {lo} {t}",
        "mount --bind {d} {lo}",
        "mount --make-private {lo}",  # else the mounts below would propagate onto it (shared /)
        "mount -t tmpfs -o size=64k,mode=0755 fleetspec-lab-disk-full {t}",
        "mkdir -p {t}/upper {t}/work",
        "dd if=/dev/zero of={t}/fill bs=4k 2>/dev/null || true",
        "mount -t overlay fleetspec-lab-disk-full -o lowerdir={lo},upperdir={t}/upper,workdir={t}/work {d}",
    )


def disk_clear_script() -> str:
    """Take the overlay away: the real folder, never written during the fault, is back as it was."""
    return _disk_script(
        "mountpoint -q {lo} || exit 0",
        "if mountpoint -q {d}; then umount {d}; fi",
        "if mountpoint -q {t}; then umount {t}; fi",
        "umount {lo}",
        "rmdir {lo} {t} 2>/dev/null || true",
    )


def _run(root: Path, address: str, host: str, script: str, what: str) -> None:
    r = ssh.run(root, address, script, timeout=60)
    if r.returncode != 0:
        raise UserError(f"{host}: {what} failed: {(r.stderr or r.stdout).decode(errors='replace').strip()}")


def apply(root: Path, host: str, specs) -> dict:
    wanted = parse(specs)
    address = lab.address_of(host)
    faults = {**_current(root, address), **wanted}
    if wanted.get("disk_full"):
        _run(root, address, host, disk_full_script(), "disk_full")
    if "gpu" in wanted:
        _run(root, address, host, gpu.install_script(wanted["gpu"], time.time()), f"gpu={wanted['gpu']}")
    _run(root, address, host, _write_script(faults), "writing faults.json")
    return faults


def clear(root: Path, host: str) -> dict:
    address = lab.address_of(host)
    _run(root, address, host, disk_clear_script(), "clearing disk_full")
    _run(root, address, host, gpu.clear_script(), "removing the GPU stand-ins")
    _run(root, address, host, f"rm -f {shlex.quote(FAULTS)}", "removing faults.json")
    return {}

"""GPUs for GPU-less lab hosts: `lab fault HOST gpu=CASE` installs the nvidia-smi stand-in
(lab/gpu_standin.py) with one fixture case's tables, and a `journalctl` whose kernel log (`-k`) is
the case's kernel.log, stamped with the time the fault was set. `xid_at_start=CODE` makes the
engine stand-in log that Xid for GPU 0 when it starts (a GPU that fails under a restart). The
engine stand-in sizes its CUDA graph from the tables' memory, as sglang does from nvidia-smi's.

The cases (tests/fixtures/nvidia-smi/health/): h200x2 and h200x1 (healthy), ecc (uncorrected ECC on
GPU 1), remap (a row remap pending on GPU 0), stray (a process that is not the service's holds GPU
1's memory), xid (Xid 79 on GPU 1 in the kernel log), old_driver (driver 515 and its old field
name). They are written in nvidia-smi's documented CSV format, not captured from GPUs; h200x1's
values (driver 580.159.04, 143771 MiB, compute capability 9.0) are those of the H200 captured in
tests/fixtures/facts/gpu_health/h200-x1-captured.json.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from fleetspec.errors import UserError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi" / "health"
ETC_GPU = "/etc/fleetspec-lab/gpu"
SMI = "/usr/local/bin/nvidia-smi"                 # where install_script puts them on a lab host
JOURNALCTL = "/usr/local/bin/journalctl"
MARK = "fleetspec lab stand-in"
FILES = ("query-gpu.csv", "query-remapped-rows.csv", "query-compute-apps.csv")

JOURNALCTL_TEXT = f"""#!/bin/sh
# {MARK}: journalctl, except that the kernel log (-k, --dmesg) is {ETC_GPU}/kernel.log
# (lines "<epoch> <message>", printed as -o short-unix prints them).
d=${{FLEETSPEC_LAB_GPU:-{ETC_GPU}}}
k=
for a in "$@"; do case $a in -k|--dmesg) k=1;; esac; done
[ -n "$k" ] || exec /usr/bin/journalctl "$@"
case " $* " in *" -n 0 "*|*" --lines=0 "*) exit 0;; esac
h=$(hostname)
[ -f "$d/kernel.log" ] || exit 0
while read -r t msg; do printf '%s %s kernel: %s\\n' "$t" "$h" "$msg"; done < "$d/kernel.log"
"""


def cases() -> list[str]:
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "query-gpu.csv").is_file()) if FIXTURES.is_dir() else []


def check_case(case: str) -> str:
    known = cases()
    if case not in known:
        raise UserError(f"fault gpu={case}: no such fixture case under {FIXTURES} (known: {', '.join(known) or 'none'})")
    return case


def standin_files(case: str, now: float, etc: str = ETC_GPU, bin_dir: str = "/usr/local/bin",
                  python: str = "/usr/bin/python3") -> dict[str, tuple[bytes, int]]:
    """path -> (bytes, mode): the stand-ins and the case's tables (kernel.log lines stamped `now`),
    as install_script writes them on a host."""
    folder = FIXTURES / check_case(case)
    log = "".join(f"{now:.6f} {line}\n" for line in (folder / "kernel.log").read_text().splitlines() if line.strip())
    out = {f"{etc}/case": ((case + "\n").encode(), 0o644), f"{etc}/kernel.log": (log.encode(), 0o644)}
    out.update({f"{etc}/{name}": ((folder / name).read_bytes(), 0o644) for name in FILES})
    source = (Path(__file__).with_name("gpu_standin.py")).read_text()
    out[f"{bin_dir}/nvidia-smi"] = (f"#!{python}\n# {MARK}\n{source}".encode(), 0o755)
    out[f"{bin_dir}/journalctl"] = (JOURNALCTL_TEXT.encode(), 0o755)
    return out


def _write(path: str, text: str, mode: str = "0644") -> str:
    return f"printf %s {shlex.quote(text)} > {shlex.quote(path)} && chmod {mode} {shlex.quote(path)}"


def install_script(case: str, now: float, etc: str = ETC_GPU, bin_dir: str = "/usr/local/bin",
                   python: str = "/usr/bin/python3") -> str:
    """The stand-ins and the case's tables, written on the host (kernel.log lines stamped `now`).
    `etc`, `bin_dir`, `python`: elsewhere than a lab host's (tests run it in a folder of theirs,
    with FLEETSPEC_LAB_GPU=etc in the environment)."""
    q = shlex.quote
    steps = [f"rm -rf {q(etc)}", f"mkdir -p {q(etc)} {q(bin_dir)}"]
    steps += [_write(path, data.decode(), f"{mode:04o}")
              for path, (data, mode) in standin_files(case, now, etc, bin_dir, python).items()]
    return " && ".join(steps)


def clear_script() -> str:
    """Remove the stand-ins (only ours: a test's own nvidia-smi is left alone) and the tables."""
    return "; ".join([*(f"grep -qs {shlex.quote(MARK)} {p} && rm -f {p}" for p in (SMI, JOURNALCTL)),
                      f"rm -rf {ETC_GPU}", "true"])

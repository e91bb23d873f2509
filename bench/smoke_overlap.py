"""Do the background smoke tests skew the gates' before-figures? (issue 17). No assertions: figures.

On ct129 (lab, stand-in engine), `deploy ct129 --algo ddtree` with gates, --runs times per mode:
  - quiet:   paused before `measure` until the smoke runner has finished, so nothing else runs;
  - nice 0:  the runner at the engine's own priority while `measure` loads the engine;
  - nice 10: the default.
Printed: the `measure` step's throughput figures (tok/s, TPOT at each concurrency) and its
seconds, median per mode. Stand-in engine figures on shared CPUs. As root, under the lab lock:

    flock /run/lock/fleetspec-labtests.lock python3 bench/smoke_overlap.py [--runs 2] [--skip-up]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "ct129"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from vs_ansible import bring_up_lab  # noqa: E402


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(ROOT), *args], capture_output=True,
                          text=True, timeout=900, env={**os.environ, **(env or {})})


def deploy(mode: str) -> dict:
    env = {"FLEETSPEC_SMOKE_NICE": "0" if mode == "nice 0" else "10"}
    cmd = [sys.executable, "-m", "fleetspec", "--root", str(ROOT), "deploy", HOST, "--algo", "ddtree", "--yes", "--json"]
    if mode == "quiet":
        env["FLEETSPEC_PAUSE_AT"] = "measure"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, **env})
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("FLEETSPEC-PAUSED measure "):
            time.sleep(12)                     # the runner (~3-6 s) ends meanwhile
            os.kill(proc.pid, signal.SIGCONT)
    proc.wait()
    outcome = [json.loads(x) for x in out if x.startswith("{")][-1]
    hist = cli("history", HOST, outcome["release"], "--json")
    measure = [json.loads(x) for x in hist.stdout.splitlines() if x.startswith("{")]
    measure = [e for e in measure if e.get("name") == "measure" and e.get("state") == "ok"][-1]
    r = cli("rollback", HOST)
    if r.returncode != 0:
        raise SystemExit(f"rollback failed: {r.stdout[-1000:]} {r.stderr[-1000:]}")
    return {**measure["detail"]["figures"], "measure_s": measure["detail"].get("seconds", 0.0),
            "status": outcome["status"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--skip-up", action="store_true")
    args = ap.parse_args()
    bring_up_lab("smoke_overlap.py", args.skip_up)
    modes = ("quiet", "nice 0", "nice 10")
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for m in modes:
            rows[m].append(deploy(m))
    keys = [k for k in rows[modes[0]][0] if k.startswith(("tok_s", "tpot"))]
    print(f"ct129, measure step's before-figures, median of {args.runs} (stand-in engine figures, shared CPUs)")
    print("| mode | " + " | ".join(keys) + " | outcomes |")
    print("|---|" + "---|" * (len(keys) + 1))
    for m in modes:
        vals = [statistics.median(r[k] for r in rows[m]) for k in keys]
        print(f"| {m} | " + " | ".join(f"{v:.1f}" for v in vals) + f" | {', '.join(r['status'] for r in rows[m])} |")


if __name__ == "__main__":
    main()

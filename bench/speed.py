"""How much of a one-host deploy is fleetspec's own time, and how fast a failed deploy is back.

On ct129 of the lab (NEXTN baseline, stand-in engine: every time here is a stand-in figure), with
ct200 beside it for `status` on 2 hosts; each figure is the median of --runs:
  - deploy (no gates): wall, the engine's wait (restart until /ready), fleetspec's own time (wall
    minus that wait; the smoke step is fleetspec's own work and counts as own), each step's
    seconds, client CPU (user+sys of the fleetspec process), and the SSH commands, SFTP transfers
    and HTTP requests one deploy makes (bench/counted.py observes the transport);
  - rollback: time to recovery and the overhead beyond the baseline's restart and load;
  - failed deploys (lab faults crash_at_start, health_503_after=0, hang_at_start, on DDTREE only):
    wall until the deploy returns with NEXTN healthy again, the detection time (the probes step),
    the revert, the baseline's load within it, and the revert's overhead beyond that load;
  - status of ct129 + ct200.
With --json FILE the figures are also written as JSON (bench/resultfile.py), which
bench/plots.py draws as "where a deploy's time goes" (docs/img/deploy-steps.png).
Hold the lab lock: flock /run/lock/fleetspec-labtests.lock python3 bench/speed.py [--runs 3]
    [--json bench/results/deploy-steps.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST, OTHER = "ct129", "ct200"


def fs(*args: str, timeout: float = 900) -> dict:
    """Run the CLI (through bench/counted.py); wall, CPU of the child, its JSON lines and counts."""
    with tempfile.TemporaryDirectory() as tmp:
        counts = Path(tmp) / "counts.json"
        cmd = [sys.executable, str(ROOT / "bench" / "counted.py"), "--root", str(ROOT), *args]
        t0 = time.monotonic()
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True,
                                    env={**os.environ, "FLEETSPEC_BENCH_COUNTS": str(counts)})
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.monotonic() - t0
            out.seek(0), err.seek(0)
            stdout, stderr = out.read(), err.read()
        return {"rc": os.waitstatus_to_exitcode(status), "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                "json": [json.loads(x) for x in stdout.splitlines() if x.startswith("{")],
                "counts": json.loads(counts.read_text()) if counts.exists() else {},
                "tail": (stdout + stderr)[-1500:]}


def must(r: dict, rc: int, what: str) -> dict:
    if r["rc"] != rc:
        raise SystemExit(f"{what}: exit {r['rc']}, expected {rc}:\n{r['tail']}")
    return r


def deploy_and_rollback(runs: int) -> dict:
    rows, rollbacks = [], []
    for _ in range(runs):
        r = must(fs("deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", "--json"), 0, "deploy")
        o = r["json"][-1]
        c = r["counts"].get(HOST, {})
        rows.append({"wall": r["wall"], "engine": o["engine_wait_s"], "own": r["wall"] - o["engine_wait_s"],
                     "cpu": r["cpu"], "steps": o["step_seconds"], "commands": c.get("commands", 0),
                     "sftp": c.get("sftp", 0), "http": c.get("http", 0), "command_list": c.get("command_list", [])})
        b = must(fs("rollback", HOST, "--json"), 0, "rollback")
        ob = b["json"][-1]
        rollbacks.append({"wall": b["wall"], "recovery": ob["seconds"], "engine": ob["engine_wait_s"],
                          "overhead": ob["seconds"] - ob["engine_wait_s"], "commands": b["counts"].get(HOST, {}).get("commands", 0)})
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    steps = {n: statistics.median(r["steps"].get(n, 0.0) for r in rows) for n in rows[0]["steps"]}
    return {"deploy": {k: med(rows, k) for k in ("wall", "engine", "own", "cpu", "commands", "sftp", "http")},
            "steps": steps, "command_list": rows[-1]["command_list"],
            "rollback": {k: med(rollbacks, k) for k in ("wall", "recovery", "engine", "overhead", "commands")}}


def failed_deploy(fault: list[str], runs: int) -> dict:
    must(fs("lab", "fault", HOST, *fault, "only_algorithm=DDTREE"), 0, "lab fault")
    rows = []
    try:
        for _ in range(runs):
            r = must(fs("deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", "--json"), 1, f"deploy with {fault}")
            o = r["json"][-1]
            if o["status"] != "rolled_back":
                raise SystemExit(f"deploy with {fault}: {o['status']}, expected rolled_back: {o['reason']}")
            revert = o["step_seconds"].get("revert", 0.0)
            rows.append({"wall": r["wall"], "detect": o["step_seconds"].get("probes", 0.0), "revert": revert,
                         "load": o["revert_wait_s"], "overhead": revert - o["revert_wait_s"],
                         "reason": o["reason"][:160]})
    finally:
        must(fs("lab", "fault", HOST, "--clear"), 0, "lab fault --clear")
    out = {k: statistics.median(x[k] for x in rows) for k in ("wall", "detect", "revert", "load", "overhead")}
    out["reason"] = rows[-1]["reason"]
    return out


@contextlib.contextmanager
def ready_timeout(seconds: float):
    """ct129's extra.ready_timeout in the lab inventory set to `seconds` for the block."""
    import yaml

    path = ROOT / "inventory" / "lab.yaml"
    before = path.read_bytes()
    data = yaml.safe_load(before)
    data["hosts"][HOST].setdefault("vars", {}).setdefault("extra", {})["ready_timeout"] = seconds
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        yield
    finally:
        path.write_bytes(before)


def status(runs: int) -> float:
    return statistics.median(must(fs("status", HOST, OTHER, "--json"), 0, "status")["wall"] for _ in range(runs))


def report(d: dict, fails: dict, status_s: float, runs: int) -> str:
    dep, rb = d["deploy"], d["rollback"]
    lines = [f"Stand-in engine figures, ct129 (NEXTN baseline), median of {runs} runs.", "",
             "| task | s | engine s | fleetspec's own s | client CPU s | SSH commands |", "|---|---|---|---|---|---|",
             f"| deploy, no gates | {dep['wall']:.2f} | {dep['engine']:.2f} | {dep['own']:.2f} | {dep['cpu']:.2f} | "
             f"{dep['commands']:.0f} (+{dep['sftp']:.0f} SFTP, {dep['http']:.0f} HTTP) |",
             f"| rollback (recovery) | {rb['recovery']:.2f} | {rb['engine']:.2f} | {rb['overhead']:.2f} | - | {rb['commands']:.0f} |",
             f"| status, 2 hosts | {status_s:.2f} | - | {status_s:.2f} | - | - |", "",
             "Deploy steps (s): " + ", ".join(f"{k} {v:.2f}" for k, v in d["steps"].items()), "",
             "| failed deploy | until healthy again s | detection s | revert s | baseline load s | revert overhead s |",
             "|---|---|---|---|---|---|"]
    for name, f in fails.items():
        lines.append(f"| {name} | {f['wall']:.2f} | {f['detect']:.2f} | {f['revert']:.2f} | {f['load']:.2f} | "
                     f"{f['overhead']:.2f} |")
    lines += ["", "SSH commands of one deploy:", *[f"    {c}" for c in d["command_list"]]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hang-runs", type=int, default=1, help="hang_at_start waits out ct129's ready_timeout")
    ap.add_argument("--hang-timeout", type=float, default=30.0,
                    help="ct129's extra.ready_timeout during the hang runs (the lab's is 120 s): a hung start is "
                         "detected only at this deadline, so the row shows the revert beyond it")
    ap.add_argument("--skip-up", action="store_true", help="the lab is up already (ct129, ct200)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/plots.py draws them)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.counted import precompile

    precompile()                  # byte-code as an installed fleetspec has it
    from vs_ansible import bring_up_lab  # bench/ is this script's folder

    bring_up_lab("speed.py", args.skip_up)
    status_s = status(args.runs)
    d = deploy_and_rollback(args.runs)
    print(json.dumps(d), flush=True)
    fails = {"crash_at_start": failed_deploy(["crash_at_start"], args.runs),
             "health_503_after=0": failed_deploy(["health_503_after=0"], args.runs)}
    if args.hang_runs:
        with ready_timeout(args.hang_timeout):
            fails["hang_at_start"] = failed_deploy(["hang_at_start"], args.hang_runs)
    print(json.dumps(fails), flush=True)
    print(report(d, fails, status_s, args.runs))
    if args.json:
        from bench import resultfile

        resultfile.write(args.json, figures(d, fails, status_s, args.runs))
    return 0


def figures(d: dict, fails: dict, status_s: float, runs: int) -> dict:
    """What --json writes: the deploy's steps in the order they ran, beside the engine's wait."""
    return {"runs": runs, "host": HOST, "deploy": d["deploy"], "steps": d["steps"], "rollback": d["rollback"],
            "failed": fails, "status_2_hosts_s": status_s, "commands_of_one_deploy": d["command_list"]}


if __name__ == "__main__":
    sys.exit(main())

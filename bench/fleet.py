"""How long fleet-wide operations take on the lab, per fleet size (issue 8). No assertions: figures.

For N in the sizes asked (default 1 2 4 8), with N lab hosts ct210.. cloned from ct200 (sglang 0.5.23):
  - `status --all` wall time (median of --runs),
  - `deploy --all --algo ddtree` wall time, and fleetspec's own time (wall minus the longest
    host's wait for its engine to restart and load; the smoke step is fleetspec's own work and
    counts as own), and the SSH commands one deploy runs on its busiest host (bench/counted.py),
  - rollback: time to recovery and fleetspec's overhead beyond the engine's restart and load,
  - bytes sent per host (the most any host got) for a first deploy (each size starts its hosts
    with no fleetspec state) and for a repeated deploy of the same patch set,
  - peak memory (RSS) and CPU time (user+sys) of the fleetspec process on the deploy,
each with its ratio against N = 1. Every fleetspec call is the real CLI in a child process.

    python3 bench/fleet.py [--sizes 1 2 4 8] [--runs 3] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


CPU: dict[str, float] = {}   # the latest child's user+sys CPU seconds, from wait4
COUNTS: dict[str, dict] = {}  # the latest child's remote actions per host, from bench/counted.py


def fs(*args: str, timeout: float = 1800) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run the CLI; (result, wall seconds, peak RSS in KiB of that child, from wait4)."""
    cmd = [sys.executable, str(ROOT / "bench" / "counted.py"), "--root", str(ROOT), *args]
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r", suffix=".json") as counts:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True,
                                env={**os.environ, "FLEETSPEC_BENCH_COUNTS": counts.name})
        _, status, usage = os.wait4(proc.pid, 0)
        COUNTS.clear()
        COUNTS.update(json.loads(counts.read() or "{}"))
        proc.returncode = os.waitstatus_to_exitcode(status)
        CPU["last"] = usage.ru_utime + usage.ru_stime
        wall = time.monotonic() - t0
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read()), wall, usage.ru_maxrss


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def sent_bytes(host: str, release: str) -> int:
    r, _, _ = fs("history", host, "--json")
    for e in json_lines(r.stdout):
        if e["release"] == release and e["name"] == "stage" and e["state"] == "ok":
            return int(e["detail"].get("sent_bytes", 0))
    return -1


def measure(n: int, runs: int) -> dict:
    hosts = [f"ct{210 + i}" for i in range(n)]          # 0.5.23 DFlash hosts, like ct200
    subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(ROOT), "lab", "up", "--hosts", ",".join(hosts)],
                   check=True, timeout=3600)
    targets = hosts
    fresh_hosts(hosts)
    status_walls = []
    for _ in range(runs):
        r, wall, _ = fs("status", *targets, "--json")
        status_walls.append(wall)
    deploy_walls, own, rss, first_bytes, repeat_bytes, recover, overhead = [], [], [], [], [], [], []
    client_cpu, steps, commands = [], [], []
    for i in range(runs):
        r, wall, peak = fs("deploy", *targets, "--algo", "ddtree", "--serial", "100%", "--yes", "--no-gates", "--json")
        outs = json_lines(r.stdout)
        if r.returncode != 0 or len(outs) != n:
            raise SystemExit(f"deploy failed at N={n}: {r.stdout[-2000:]} {r.stderr[-2000:]}")
        engine = max(o["engine_wait_s"] for o in outs)
        deploy_walls.append(wall)
        own.append(wall - engine)
        steps.append({name: max(o["step_seconds"].get(name, 0.0) for o in outs)
                      for name in outs[0]["step_seconds"]})
        client_cpu.append(CPU["last"])
        commands.append(max(c["commands"] for c in COUNTS.values()))
        rss.append(peak)
        (first_bytes if i == 0 else repeat_bytes).append(max(sent_bytes(o["host"], o["release"]) for o in outs))
        r, wall, _ = fs("rollback", *hosts, "--json")
        if r.returncode != 0:
            raise SystemExit(f"rollback failed at N={n}: {r.stdout[-2000:]} {r.stderr[-2000:]}")
        for o in json_lines(r.stdout):
            recover.append(o["seconds"])
            overhead.append(o["seconds"] - o["engine_wait_s"])
    return {"n": n, "status_s": statistics.median(status_walls), "deploy_s": statistics.median(deploy_walls),
            "deploy_own_s": statistics.median(own), "deploy_client_cpu_s": statistics.median(client_cpu),
            "deploy_ssh_commands": statistics.median(commands),
            "rollback_recovery_s": statistics.median(recover),
            "rollback_overhead_s": statistics.median(overhead), "first_deploy_bytes": statistics.median(first_bytes),
            "repeat_deploy_bytes": statistics.median(repeat_bytes) if repeat_bytes else None,
            "peak_rss_mib": round(max(rss) / 1024, 1),
            "steps_s": {name: round(statistics.median(s.get(name, 0.0) for s in steps), 2) for name in steps[0]}}


def fresh_hosts(hosts: list[str]) -> None:
    """Bench hosts start each size on their own unit with no fleetspec state (so 'bytes first'
    is a first contact), whatever an interrupted earlier run left."""
    from fleetspec.lab import lab, ssh

    reset = ("rm -f /etc/systemd/system/sglang-qwen.service.d/50-fleetspec.conf /etc/systemd/system/sglang-qwen.service.d/zz-fleetspec.conf && rm -rf /var/lib/fleetspec && "
             "systemctl daemon-reload && systemctl restart sglang-qwen.service")
    for host in hosts:
        ssh.run(ROOT, lab.address_of(host), reset, timeout=120)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        r, _, _ = fs("status", *hosts, "--json")
        if all(row["health"] == "ok" for row in json_lines(r.stdout)):
            return
        time.sleep(2)
    raise SystemExit(f"bench hosts not healthy after reset: {r.stdout}")


def table(rows: list[dict]) -> str:
    base = rows[0]
    cols = [("N", "n", "{}"), ("status --all s", "status_s", "{:.2f}"), ("x N=1", "status_s", "ratio"),
            ("deploy s", "deploy_s", "{:.1f}"), ("own s", "deploy_own_s", "{:.2f}"), ("own x N=1", "deploy_own_s", "ratio"),
            ("client CPU s", "deploy_client_cpu_s", "{:.2f}"), ("SSH cmds/host", "deploy_ssh_commands", "{:.0f}"),
            ("rollback s", "rollback_recovery_s", "{:.1f}"), ("rollback overhead s", "rollback_overhead_s", "{:.2f}"),
            ("bytes first", "first_deploy_bytes", "{:.0f}"), ("bytes repeat", "repeat_deploy_bytes", "{}"),
            ("peak RSS MiB", "peak_rss_mib", "{}")]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for _, key, fmt in cols:
            if fmt == "ratio":
                cells.append(f"{r[key] / base[key]:.2f}" if base[key] else "-")
            else:
                cells.append(fmt.format(r[key]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def steps_table(rows: list[dict]) -> str:
    """Where a deploy's time goes: each step's seconds on its slowest host (median of the runs).
    On shared CPUs the on-host steps grow with N; fleetspec's own waiting does not."""
    names = list(rows[0]["steps_s"])
    lines = ["| N | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for r in rows:
        lines.append(f"| {r['n']} | " + " | ".join(f"{r['steps_s'].get(n, 0):.2f}" for n in names) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/fleet.py brings up the lab: run it as root")
    rows = []
    for n in args.sizes:
        rows.append(measure(n, args.runs))
        print(json.dumps(rows[-1]), flush=True)
    text = table(rows) + "\n\nSeconds per deploy step on the slowest host:\n\n" + steps_table(rows)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long fleet-wide operations take on the lab, per fleet size. No assertions: figures.

Two series, each N measured in one process (the lab stays up between sizes):
  - full: N lab hosts ct210.. cloned from ct200 (sglang 0.5.23, the full engine stand-in that
    imports sglang and torch at start), --sizes (default 1 2 4 8);
  - thin: N thin lab hosts tn1.. (ct200's sglang install and unit, an engine that imports nothing:
    fleetspec/lab/profiles.py), --thin-sizes (default 1 2 4 8 16 32). Every deploy step runs for
    real (preflight, baseline, stage, smoke with the real sglang, render, switch, restart, probes);
    only the engine's own start is cheap, so 32 hosts fit on two cores.
Per N: `status` of the N hosts (median of --runs: wall time and the CLI's CPU), `deploy --algo
ddtree --serial 100% --no-gates` wall time and fleetspec's own time (wall minus the longest host's wait for its engine to restart
and load; the smoke step is fleetspec's own work and counts as own; "first" is run 1, a first
deploy whose smoke tests run, "repeat" the median of the later runs, redeploys of the same
content whose smoke verdict is replayed (smoke.reuse)), the fleetspec process's CPU
time (user+sys) in all and per host, SSH commands per host (bench/counted.py), rollback, bytes
sent, peak RSS, each with its ratio against N = 1 of the same series. And the CPU the N hosts' containers
used during each deploy (each lab host's cgroup), beside the controller's, over the machine's cores:
the least wall time that work needs here (the CPU floor), which says how much of the growth with N
is the shared cores. Then a least-squares fit
of own time and client CPU against N per series, and the thin fit extrapolated to 500 hosts.
Each size starts with one unrecorded deploy (the first smoke import took 23 s cold where the next
took 5 s, which made N = 1 the slowest row; and a host's first deploy after its boot changes the
install as a smoke verdict's check sees it: overlayfs sets xattrs on copied-up folders).
The engine is the lab's stand-in on a shared 2-core machine: every figure is a stand-in figure.

    flock /run/lock/fleetspec-labtests.lock python3 bench/fleet.py [--sizes 1 2 4 8]
        [--thin-sizes 1 2 4 8 16 32] [--runs 3] [--rows rows.jsonl] [--out FILE] [--json FILE] [--keep]
    python3 bench/fleet.py --report rows.jsonl [--out FILE]      # tables and fit, no lab

--json FILE writes the rows as one JSON file (bench/resultfile.py; --report reads it too), which
bench/plots.py draws as own time and controller CPU against fleet size (docs/img/fleet-size.png).

Hold the lab lock at most ~10 minutes: split a long run with --rows (appends one JSON line per
size) and print the whole table with --report.
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
sys.path.insert(0, str(ROOT))

from bench import scaling

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


def cgroup_cpu_seconds(folder: Path) -> float | None:
    """CPU seconds a cgroup and its children have used: cgroup v1's cpuacct.usage (ns) or v2's
    cpu.stat usage_usec; None where the folder has neither."""
    try:
        return int((folder / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        pass
    try:
        for line in (folder / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None


def host_cpu(hosts: list[str]) -> float:
    """CPU seconds the hosts' containers have used so far, summed: every process of a lab host
    (sshd, fleetspec's remote programs, systemd, the engine) runs in its own cgroup (LAB.md)."""
    from fleetspec.lab.hosts import HostState

    total = 0.0
    for host in hosts:
        state = HostState.load(host)
        used = None
        for folder in (state.cgroups if state else []):
            if (used := cgroup_cpu_seconds(Path(folder))) is not None:
                break
        if used is None:
            raise SystemExit(f"no CPU accounting for lab host {host}'s cgroup ({state.cgroups if state else 'no state'})")
        total += used
    return total


def cores() -> int:
    return len(os.sched_getaffinity(0))


def bench_hosts(kind: str, n: int) -> list[str]:
    """full: 0.5.23 DFlash hosts like ct200; thin: the same shape with the engine that imports nothing."""
    return [f"tn{1 + i}" for i in range(n)] if kind == "thin" else [f"ct{210 + i}" for i in range(n)]


def measure(n: int, runs: int, kind: str = "full", warm_up: bool = False) -> dict:
    hosts = bench_hosts(kind, n)
    subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(ROOT), "lab", "up", "--hosts", ",".join(hosts)],
                   check=True, timeout=3600)
    fresh_hosts(hosts)
    if warm_up:      # not recorded: the first smoke import after a while reads sglang from disk
        fs("deploy", *hosts, "--algo", "ddtree", "--serial", "100%", "--yes", "--no-gates", "--json")
        fresh_hosts(hosts)              # 'bytes first' stays a first contact
    status_walls, status_cpu = [], []
    for _ in range(runs):
        r, wall, _ = fs("status", *hosts, "--json")
        status_walls.append(wall)
        status_cpu.append(CPU["last"])
    deploy_walls, own, rss, first_bytes, repeat_bytes, recover, overhead = [], [], [], [], [], [], []
    client_cpu, steps, commands, failed, hosts_cpu = [], [], [], [], []
    for i in range(runs):
        before = host_cpu(hosts)
        r, wall, peak = fs("deploy", *hosts, "--algo", "ddtree", "--serial", "100%", "--yes", "--no-gates", "--json")
        hosts_cpu.append(host_cpu(hosts) - before)
        outs = json_lines(r.stdout)
        if len(outs) != n:
            raise SystemExit(f"deploy failed at N={n} ({kind}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
        # A host that failed is a finding at this size, not the end of the run: kept in the row.
        failed += [{k: o.get(k) for k in ("host", "status", "failed_step", "reason")}
                   for o in outs if o["status"] != "healthy"]
        deploy_walls.append(wall)
        own.append(wall - max(o["engine_wait_s"] for o in outs))
        steps.append({name: max(o["step_seconds"].get(name, 0.0) for o in outs)
                      for name in outs[0]["step_seconds"]})
        client_cpu.append(CPU["last"])
        commands.append(statistics.mean(c["commands"] for c in COUNTS.values()))
        rss.append(peak)
        (first_bytes if i == 0 else repeat_bytes).append(max(sent_bytes(o["host"], o["release"]) for o in outs
                                                             if o["status"] == "healthy"))
        moved = [o["host"] for o in outs if o["status"] == "healthy"]    # a failed host reverted itself
        r, wall, _ = fs("rollback", *moved, "--json")
        if r.returncode != 0:
            raise SystemExit(f"rollback failed at N={n} ({kind}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
        for o in json_lines(r.stdout):
            recover.append(o["seconds"])
            overhead.append(o["seconds"] - o["engine_wait_s"])
    med = statistics.median
    return {"kind": kind, "n": n, "status_s": med(status_walls), "status_client_cpu_s": med(status_cpu),
            "deploy_s": med(deploy_walls),
            "deploy_own_s": med(own), "deploy_own_first_s": own[0],
            "deploy_own_repeat_s": med(own[1:]) if len(own) > 1 else None, "deploy_client_cpu_s": med(client_cpu),
            "client_cpu_per_host_s": med(client_cpu) / n, "deploy_ssh_commands": med(commands),
            "rollback_recovery_s": med(recover), "rollback_overhead_s": med(overhead),
            "first_deploy_bytes": med(first_bytes), "repeat_deploy_bytes": med(repeat_bytes) if repeat_bytes else None,
            "peak_rss_mib": round(max(rss) / 1024, 1), "failed": failed,
            "deploy_first_s": deploy_walls[0], "deploy_repeat_s": med(deploy_walls[1:]) if runs > 1 else None,
            "client_cpu_first_s": client_cpu[0], "client_cpu_repeat_s": med(client_cpu[1:]) if runs > 1 else None,
            "hosts_cpu_first_s": hosts_cpu[0], "hosts_cpu_repeat_s": med(hosts_cpu[1:]) if runs > 1 else None,
            "cores": cores(),
            "steps_s": {name: round(med(s.get(name, 0.0) for s in steps), 2) for name in steps[0]}}


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


COLUMNS = [("kind", "kind", "{}"), ("N", "n", "{}"), ("status s", "status_s", "{:.2f}"),
           ("x N=1", "status_s", "ratio"), ("status CPU s", "status_client_cpu_s", "{:.2f}"), ("deploy s", "deploy_s", "{:.1f}"), ("own s", "deploy_own_s", "{:.2f}"),
           ("own x N=1", "deploy_own_s", "ratio"), ("own first s", "deploy_own_first_s", "{:.2f}"),
           ("first x N=1", "deploy_own_first_s", "ratio"), ("own repeat s", "deploy_own_repeat_s", "{:.2f}"),
           ("repeat x N=1", "deploy_own_repeat_s", "ratio"), ("client CPU s", "deploy_client_cpu_s", "{:.2f}"),
           ("CPU x N=1", "deploy_client_cpu_s", "ratio"), ("CPU/host s", "client_cpu_per_host_s", "{:.3f}"),
           ("SSH cmds/host", "deploy_ssh_commands", "{:.1f}"), ("rollback s", "rollback_recovery_s", "{:.1f}"),
           ("rollback overhead s", "rollback_overhead_s", "{:.2f}"), ("bytes first", "first_deploy_bytes", "{:.0f}"),
           ("bytes repeat", "repeat_deploy_bytes", "{}"), ("peak RSS MiB", "peak_rss_mib", "{}")]


def table(rows: list[dict]) -> str:
    """One line per row; ratios against N = 1 of the same kind (or its smallest N)."""
    base = {}
    for r in sorted(rows, key=lambda r: r["n"]):
        base.setdefault(r.get("kind", "full"), r)
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        b = base[r.get("kind", "full")]
        cells = []
        for _, key, fmt in COLUMNS:
            if fmt == "ratio":
                cells.append(f"{r[key] / b[key]:.2f}" if b.get(key) and r.get(key) is not None else "-")
            else:
                value = r.get(key, "full" if key == "kind" else None)
                cells.append("-" if value is None else fmt.format(value))    # rows from before a column
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def steps_table(rows: list[dict]) -> str:
    """Where a deploy's time goes: each step's seconds on its slowest host (median of the runs).
    On shared CPUs the on-host steps grow with N; fleetspec's own waiting does not."""
    names = sorted({name for r in rows for name in r["steps_s"]})
    lines = ["| kind | N | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for r in rows:
        lines.append(f"| {r.get('kind', 'full')} | {r['n']} | "
                     + " | ".join(f"{r['steps_s'].get(n, 0):.2f}" for n in names) + " |")
    return "\n".join(lines)


def cpu_table(rows: list[dict]) -> str:
    """What the lab's shared cores allow: the CPU every host's container and the controller used
    during one deploy, over the cores they share, is the least wall time any schedule of that work
    needs on this machine ("CPU floor"). Where the floor is most of the deploy's wall time, the
    machine was busy throughout, and the growth with N is the cores, not fleetspec waiting."""
    lines = ["| kind | N | run | deploy s | own s | hosts' CPU s | per host s | client CPU s | cores | "
             "CPU floor s | floor / deploy |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "hosts_cpu_first_s" not in r:        # rows from before these columns
            continue
        for run, own in (("first", r["deploy_own_first_s"]), ("repeat", r["deploy_own_repeat_s"])):
            wall, hosts_cpu, client = (r.get(f"{k}_{run}_s") for k in ("deploy", "hosts_cpu", "client_cpu"))
            if wall is None:
                continue
            floor = (hosts_cpu + client) / r["cores"]
            lines.append(f"| {r.get('kind', 'full')} | {r['n']} | {run} | {wall:.2f} | {own:.2f} | {hosts_cpu:.2f} | "
                         f"{hosts_cpu / r['n']:.2f} | {client:.2f} | {r['cores']} | {floor:.2f} | {floor / wall:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[1, 2, 4, 8], help="full stand-in hosts")
    ap.add_argument("--thin-sizes", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32], help="thin hosts")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rows", type=Path, default=None, help="append each size's row (JSON) to this file")
    ap.add_argument("--report", type=Path, default=None, help="print the tables of a --rows file; measure nothing")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here (bench/plots.py draws them)")
    ap.add_argument("--keep", action="store_true", help="leave the bench's lab hosts up")
    args = ap.parse_args()
    from bench.counted import precompile

    precompile()                  # byte-code as an installed fleetspec has it
    if args.report:
        rows = read_rows(args.report)
    else:
        if os.geteuid() != 0:
            raise SystemExit("bench/fleet.py brings up the lab: run it as root, under the lab lock")
        rows = []
        try:
            for kind, sizes in (("full", args.sizes), ("thin", args.thin_sizes)):
                for n in sizes:
                    # every size warms up: the hosts share their image's lower layers (one warm page
                    # cache would serve every size), but a host's first deploy after its boot also has
                    # overlayfs set xattrs on its copied-up folders, which a smoke verdict's check counts
                    # as a change of the install: without it run 2, not run 1, would be the first replay
                    rows.append(measure(n, args.runs, kind, warm_up=True))
                    print(json.dumps(rows[-1]), flush=True)
                    if args.rows:
                        with args.rows.open("a") as fh:
                            fh.write(json.dumps(rows[-1]) + "\n")
        finally:
            if not args.keep:
                subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(ROOT), "lab", "down"], timeout=600)
    failures = [f"- {r.get('kind', 'full')} N={r['n']}: {f['host']} {f['status']} at {f['failed_step']}: {f['reason']}"
                for r in rows for f in r.get("failed", [])]
    text = (table(rows) + ("\n\nHosts that failed:\n" + "\n".join(failures) if failures else "") + "\n\nSeconds per deploy step on the slowest host:\n\n" + steps_table(rows)
            + "\n\nCPU used during one deploy, hosts' containers and the controller, against the machine's cores:\n\n"
            + cpu_table(rows) + "\n\n" + scaling.report(rows))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.json:
        from bench import resultfile

        resultfile.write(args.json, {"rows": rows}, runs=args.runs)
    return 0


def read_rows(path: Path) -> list[dict]:
    """Rows of a --rows file (one JSON line per size) or of a --json file (`{"meta", "rows"}`)."""
    text = path.read_text()
    if text.lstrip().startswith("{") and '"meta"' in text[:200]:
        return json.loads(text)["rows"]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main())

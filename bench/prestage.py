"""`deploy --prestage` against a plain canary rollout on N lab hosts. No assertions: figures.

N lab hosts ct220.. cloned from ct200 (sglang 0.5.23, stand-in engine), each run from no fleetspec
state (so staging has everything to send): `deploy --canary 1 --serial 100% --no-gates` with and
without `--prestage`, alternating. Printed per mode (median of --runs): wall time, fleetspec's own
time (wall minus the canary's engine wait and the later batch's longest engine wait; smoke counts
as own), each batch's own time (its slowest host's deploy seconds minus its engine wait), the
later hosts' slowest stage and smoke steps and the bytes their own stage step sent. With
--prestage the later hosts' smoke tests run during the canary's deploy, on the same 2 shared
cores here; on hosts with their own CPUs they cost the canary nothing.
Stand-in engine figures on the lab's shared CPUs, not GPU results. Run as root, under the lab lock:

    flock /run/lock/fleetspec-labtests.lock python3 bench/prestage.py [--n 4] [--runs 1] [--down]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet as F  # bench/fleet.py: the CLI runner, JSON lines, host reset


def stage_sent(host: str, release: str) -> tuple[int, int]:
    """Bytes the prestage sent and bytes the deploy's own stage step sent, for one host's release."""
    r, _, _ = F.fs("history", host, release, "--json")
    stages = [e for e in F.json_lines(r.stdout) if e.get("release") == release and e.get("name") == "stage"
              and e.get("state") == "ok"]
    pre = sum(int(e["detail"].get("sent_bytes", 0)) for e in stages if e["detail"].get("prestage"))
    own = [int(e["detail"].get("sent_bytes", 0)) for e in stages if not e["detail"].get("prestage")]
    return pre, (own[0] if own else -1)


def one(hosts: list[str], prestage: bool) -> dict:
    F.fresh_hosts(hosts)
    extra = ["--prestage"] if prestage else []
    r, wall, _ = F.fs("deploy", *hosts, "--algo", "ddtree", "--canary", "1", "--serial", "100%", "--no-gates",
                      "--yes", "--json", *extra)
    outs = {o["host"]: o for o in F.json_lines(r.stdout)}
    if r.returncode != 0 or len(outs) != len(hosts):
        raise SystemExit(f"deploy failed: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    later = [outs[h] for h in hosts[1:]]
    engine = outs[hosts[0]]["engine_wait_s"] + max((o["engine_wait_s"] for o in later), default=0.0)
    own = lambda o: o["seconds"] - o["engine_wait_s"]
    return {"wall": wall, "own": wall - engine, "cpu": F.CPU["last"], "canary_own": own(outs[hosts[0]]),
            "later_own": max((own(o) for o in later), default=0.0),
            "later_stage": max((o["step_seconds"]["stage"] for o in later), default=0.0),
            "later_smoke": max((o["step_seconds"]["smoke"] for o in later), default=0.0),
            "later_prestaged": max((stage_sent(o["host"], o["release"])[0] for o in later), default=0),
            "later_sent": max((stage_sent(o["host"], o["release"])[1] for o in later), default=0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--down", action="store_true", help="take this fleet root's lab hosts down at the end")
    args = ap.parse_args()
    hosts = [f"ct{220 + i}" for i in range(args.n)]
    subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(F.ROOT), "lab", "up", "--hosts", ",".join(hosts)],
                   check=True, timeout=3600)
    rows: dict[bool, list[dict]] = {False: [], True: []}
    try:
        for _ in range(args.runs):
            for prestage in (False, True):
                rows[prestage].append(one(hosts, prestage))
    finally:
        if args.down:
            subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(F.ROOT), "lab", "down"], timeout=600)
    print(f"N={args.n}, canary 1 then {args.n - 1} at once, --no-gates, median of {args.runs} "
          "(stand-in engine figures, shared CPUs)")
    print("| mode | wall s | own s | canary's own s | later batch's own s | client CPU s | later hosts' stage s | "
          "their smoke s | prestage sent bytes | their stage sent bytes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for prestage, label in ((False, "canary"), (True, "canary --prestage")):
        m = {k: statistics.median(r[k] for r in rows[prestage]) for k in rows[prestage][0]}
        print(f"| {label} | {m['wall']:.2f} | {m['own']:.2f} | {m['canary_own']:.2f} | {m['later_own']:.2f} | "
              f"{m['cpu']:.2f} | {m['later_stage']:.2f} | "
              f"{m['later_smoke']:.2f} | {int(m['later_prestaged'])} | {int(m['later_sent'])} |")


if __name__ == "__main__":
    main()

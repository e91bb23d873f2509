"""A rolling deploy (`--serial 1`) of thin lab hosts behind the real sglang-router 0.3.2 under a
constant closed-loop load, without and then with fleetspec's router integration. No assertions:
figures.

Per run: requests sent and failed (before the deploy and during it), p50/p99 latency before and
during, the deploy's wall time, and for each host how long it was out of the router (fleetspec's
own figure with the integration) and how long the router listed it unhealthy or not at all
(polled every 0.2 s: the time clients could have been sent to a restarting engine is the part
that was still listed). The router runs on the controller's 127.0.0.1; the engines are the lab's
thin stand-in (no sglang or torch import, fast restarts): every figure is a stand-in figure.

    flock /run/lock/fleetspec-labtests.lock python3 bench/rollout_under_load.py [--hosts tn71,tn72]
        [--clients 4] [--before 5] [--json bench/results/rollout-under-load.json] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import resultfile
from fleetspec.lab.load import Load, summary
from fleetspec.lab.router import LabRouter, router_inventory


def fs(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(ROOT), *args], capture_output=True,
                          text=True, timeout=timeout)


class Watch:
    """Polls the router's /workers: seconds each worker was not listed healthy."""

    def __init__(self, router: LabRouter, workers: dict[str, str]):
        self.router, self.workers = router, workers
        self.off = {h: 0.0 for h in workers}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.2):
            now = time.monotonic()
            try:
                healthy = {w.url for w in self.router.client.workers() if w.healthy}
            except Exception:
                healthy = set()
            for h, url in self.workers.items():
                if url not in healthy:
                    self.off[h] += now - last
            last = now

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def one_run(label: str, inv: str, hosts: list[str], router: LabRouter, workers: dict[str, str], clients: int,
            before_s: float) -> dict:
    for h in hosts:               # each run switches from the baseline
        fs("-i", inv, "rollback", h)
    load = Load(router.url, clients=clients, seconds=300, max_new_tokens=8).start()
    try:
        load.wait_for(10)
        time.sleep(before_s)
        began = time.monotonic()
        with Watch(router, workers) as watch:
            r = fs("-i", inv, "deploy", *hosts, "--algo", "ddtree", "--serial", "1", "--yes", "--no-gates", "--json")
        ended = time.monotonic()
        time.sleep(1.0)
    finally:
        answers = load.stop()
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    out = {"label": label, "deploy_rc": r.returncode, "deploy_s": round(ended - began, 2),
           "before": summary([a for a in answers if a.at < began]),
           "during": summary([a for a in answers if began <= a.at <= ended]),
           "all": summary(answers),
           "hosts": {row["host"]: {"status": row["status"], "out_of_router_s": (row.get("router") or {}).get("out_s"),
                                   "not_listed_healthy_s": round(watch.off.get(row["host"], 0.0), 2)}
                     for row in rows}}
    codes: dict[int, int] = {}
    for a in answers:
        if not a.ok:
            codes[a.status] = codes.get(a.status, 0) + 1
    out["failed_by_status"] = {str(k): v for k, v in sorted(codes.items())}
    return out


def show(run: dict) -> None:
    b, d = run["before"], run["during"]
    print(f"\n== {run['label']} (stand-in engine figures): deploy exit {run['deploy_rc']}, {run['deploy_s']:.1f}s")
    print(f"   requests sent {run['all']['sent']}, failed {run['all']['failed']} {run['failed_by_status'] or ''}")
    print(f"   before: sent {b['sent']}, failed {b['failed']}, p50 {b['p50_s']}s, p99 {b['p99_s']}s")
    print(f"   during: sent {d['sent']}, failed {d['failed']}, p50 {d['p50_s']}s, p99 {d['p99_s']}s")
    for h, v in run["hosts"].items():
        out = v["out_of_router_s"]
        print(f"   {h}: {v['status']}, out of the router {'-' if out is None else f'{out:.1f}s'}, "
              f"not listed healthy {v['not_listed_healthy_s']:.1f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="tn71,tn72")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--before", type=float, default=5.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="leave the lab hosts up")
    args = ap.parse_args()
    from fleetspec.lab import lab

    hosts = args.hosts.split(",")
    up = lab.up(ROOT, hosts, log=lambda m: print(m, file=sys.stderr, flush=True))
    workers = {h: f"http://{up.addresses[h]}:30000" for h in hosts}
    log = Path(tempfile.mkdtemp(prefix="rollout-under-load-")) / "router.log"
    router = LabRouter(list(workers.values()), log).start()
    inv_with = router_inventory(up.inventory, hosts, router.url, f"lab-router-bench-{os.getpid()}.yaml",
                                min_serving=1, drain_timeout=30, add_timeout=60)
    inv_without = router_inventory(up.inventory, [], router.url, f"lab-norouter-bench-{os.getpid()}.yaml")
    try:
        runs = [one_run("without the router integration", str(inv_without), hosts, router, workers, args.clients,
                        args.before),
                one_run("with the router integration", str(inv_with), hosts, router, workers, args.clients,
                        args.before)]
    finally:
        inv_with.unlink(missing_ok=True)
        inv_without.unlink(missing_ok=True)
        router.stop()
        if not args.keep:
            for h in hosts:
                fs("rollback", h)
            lab.down(ROOT, only=hosts)
    for run in runs:
        show(run)
    if args.json:
        resultfile.write(args.json, {"hosts": hosts, "clients": args.clients, "router": "sglang-router 0.3.2",
                                     "runs": runs}, stand_in=True,
                         note="thin lab engines behind the real sglang-router on the controller; "
                              "deploy --serial 1 --no-gates")
    return 0


if __name__ == "__main__":
    sys.exit(main())

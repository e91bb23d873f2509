"""fleetspec against an idiomatic Ansible playbook doing the same job, side by side on ct129.

bench/ansible/deploy.yml installs the same patch-set files fleetspec installs (its variables come
from fleetspec's own preflight of ct129, so the bytes and the new ExecStart are the same), backs up
and restores with block/rescue, and waits for /health with `until`/`retries` (--health-retries,
one try a second). Each run does, alternating the tools so load from elsewhere hits both alike:
Ansible's deploy and rollback (its playbook patches sglang in place and puts it back), then
fleetspec's deploy (no gates) and rollback three ways: with smoke.reuse: false (the smoke tests
run, as on a first deploy of new content), with smoke.when: beside-load and smoke.reuse: false
(the tests run while the new engine loads, not before the switch), and the default twice: its
first deploy runs the tests (Ansible changed the install) and keeps the verdict, its second, the
one recorded, replays it (a redeploy of the same content); and `deploy --stage-only` (smoke.reuse:
false: its tests run) followed by the deploy that switches to that staged release, the deploy's
time recorded apart from the staging's (staging is done before a maintenance window); a failed
deploy (lab fault crash_at_start on DDTREE) until the baseline is healthy again, and status of
ct129 + ct200. Median of --runs; ratios are fleetspec's
time over Ansible's. The engine is the lab's stand-in: every time here is a stand-in figure.

During each deploy a watcher on ct129 itself asks /health every 50 ms (python's urllib, 1 s
timeout) and reports how long the service did not answer 200: the service's downtime, as
opposed to the deploy's wall time (fleetspec's smoke tests run while the old engine still serves).

    flock /run/lock/fleetspec-labtests.lock python3 bench/vs_ansible.py [--runs 3] [--ansible-playbook PATH]
        [--json bench/results/vs-ansible.json]
    python3 bench/vs_ansible.py --report bench/results/vs-ansible.json      # the tables again, no lab

With --json FILE the medians and every run are written as JSON (bench/resultfile.py), which
bench/plots.py draws (docs/img/vs-ansible.png).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HOST, OTHER = "ct129", "ct200"
HERE = Path(__file__).resolve().parent / "ansible"


def timed(cmd: list[str], env: dict | None = None, timeout: float = 900) -> tuple[int, float, str]:
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return r.returncode, time.monotonic() - t0, (r.stdout + r.stderr)[-3000:]


def fs(*args: str, root: Path = ROOT) -> tuple[int, float, str]:
    return timed([sys.executable, "-m", "fleetspec", "--root", str(root), *args])


def smoke_root(work: Path, name: str, **smoke) -> Path:
    """A fleet root for ct129 whose ddtree playbook's smoke section has `smoke` set."""
    from tests.lab.reliability_lab import make_root

    def edit(data: dict) -> None:
        data["smoke"].update(smoke)

    return make_root(work / name, [HOST], playbooks={"ddtree.yaml": edit})


def bring_up_lab(script: str, skip_up: bool) -> None:
    """As root (the lab needs it), `lab up` of ct129 and ct200 unless told they are up, then wait."""
    if os.geteuid() != 0:
        raise SystemExit(f"bench/{script} uses the lab: run it as root, under the lab lock")
    if not skip_up:
        subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(ROOT), "lab", "up", "--hosts",
                        f"{HOST},{OTHER}"], check=True, timeout=1800)
    wait_healthy([HOST, OTHER])


def wait_healthy(hosts: list[str], timeout: float = 300) -> None:
    """`lab up` returns once the hosts boot; their engines load after that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(ROOT), "status", *hosts, "--json"],
                           capture_output=True, text=True, timeout=120)
        rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        if len(rows) == len(hosts) and all(row.get("health") == "ok" for row in rows):
            return
        time.sleep(2)
    raise SystemExit(f"lab hosts not healthy after {timeout:.0f}s: {r.stdout[-1000:]}")


# On the host: /health every 50 ms until stdin closes, then the seconds it was not 200.
_DOWN_WATCH = r"""
import sys, threading, time, urllib.request
url, stop, down, since = sys.argv[1], threading.Event(), 0.0, None
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    now = time.monotonic()
    try:
        ok = urllib.request.urlopen(url, timeout=1).status == 200
    except Exception:
        ok = False
    if not ok and since is None:
        since = now
    elif ok and since is not None:
        down, since = down + (now - since), None
    time.sleep(0.05)
if since is not None:
    down += time.monotonic() - since
print("DOWN %.3f" % down, flush=True)
"""


class DownWatch:
    """The watcher above on ct129, over the lab's plain ssh (not fleetspec's transport)."""

    def __init__(self, address: str, python: str, port: int):
        from fleetspec.lab import ssh
        cmd = f"{shlex.quote(python)} -c {shlex.quote(_DOWN_WATCH)} http://127.0.0.1:{port}/health"
        self.proc = subprocess.Popen([*ssh.argv(ROOT, address), "--", "sh", "-c", shlex.quote(cmd)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)      # up and polling before the deploy starts

    def seconds(self) -> float:
        out, _ = self.proc.communicate("", timeout=30)
        line = [x for x in out.splitlines() if x.startswith("DOWN ")]
        if not line:
            raise SystemExit(f"the downtime watcher on {HOST} said nothing (exit {self.proc.returncode})")
        return float(line[-1].split()[1])


def watched(address: str, python: str, port: int, run) -> tuple[tuple[int, float, str], float]:
    """run() with the downtime watcher on; (its result, seconds /health was not 200)."""
    watch = DownWatch(address, python, port)
    try:
        result = run()
    finally:
        down = watch.seconds()
    return result, down


def playbook_vars(health_retries: int) -> tuple[dict, dict]:
    """What deploy.yml needs, from fleetspec's preflight of ct129 (read-only), and the Ansible
    inventory for ct129 + ct200 with the lab's key and known_hosts."""
    from fleetspec import systemd_unit
    from fleetspec.model.inventory import load_inventory
    from fleetspec.model.playbook import load_playbook_for
    from fleetspec.ops import preflight
    from fleetspec.ops.deploy import DeployRequest
    from fleetspec.remote.transport import TransportPool

    inv = load_inventory(ROOT / "inventory" / "lab.yaml")
    hosts = dict(inv.hosts)
    with TransportPool() as pool:
        host = hosts[HOST]
        t = pool.get(host)
        req = DeployRequest(host=host, playbook=load_playbook_for(ROOT, "ddtree"), root=ROOT, mode="in-place",
                            plan_only=True)
        pf = preflight.run(t, req, echo=lambda _: None)
        baseline_algo = json.loads(t.http("GET", host.vars.api_port, "/server_info").body)["speculative_algorithm"]
    variables = {
        "service": pf.service, "unit_path": pf.unit.fragment_path, "python": pf.python,
        "site_packages": pf.sglang.site_packages, "port": host.vars.api_port,
        "patch_files": [{"src": str(pf.patchset.source(f)), "path": f.path} for f in pf.patchset.files],
        "exec_line": systemd_unit.exec_line(pf.new_argv, pf.exec_prefix, pf.exec_path),
        "expected_algorithm": pf.playbook_algorithm.upper(), "baseline_algorithm": str(baseline_algo).upper(),
        "backup_dir": "/root/ansible-bench-backup", "health_retries": health_retries,
    }
    lab_ssh = ROOT / ".lab" / "ssh"
    common = f"-F /dev/null -o UserKnownHostsFile={lab_ssh / 'known_hosts'} -o StrictHostKeyChecking=yes"
    entry = lambda h: {"ansible_host": h.address, "ansible_user": "root",
                       "ansible_ssh_private_key_file": str(lab_ssh / "id_ed25519"),
                       "ansible_ssh_common_args": common, "ansible_python_interpreter": h.vars.python,
                       "service": h.vars.service, "port": h.vars.api_port}
    inventory = {"all": {"children": {"bench": {"hosts": {HOST: entry(hosts[HOST])}},
                                      "others": {"hosts": {OTHER: entry(hosts[OTHER])}}}}}
    return variables, inventory, (hosts[HOST].address, pf.python, host.vars.api_port)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--health-retries", type=int, default=30, help="deploy.yml's /health tries, one a second")
    ap.add_argument("--ansible-playbook", default=shutil.which("ansible-playbook") or "ansible-playbook")
    ap.add_argument("--skip-up", action="store_true")
    ap.add_argument("--report", type=Path, default=None,
                    help="print the tables of a run's JSON line or --json file (its 'runs', else its "
                         "'medians'); measure nothing")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/plots.py draws them)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="rounds of deploy and rollback by each tool, not recorded (the first deploy after "
                         "`lab up` pays cold page caches: 24 s where the next took 14)")
    args = ap.parse_args()
    if args.report:
        print(report(load(args.report)))
        return 0
    if shutil.which(args.ansible_playbook) is None:
        print(f"vs_ansible.py: {args.ansible_playbook} not found: install it with `pip install ansible-core` "
              "or name it with --ansible-playbook PATH", file=sys.stderr)
        return 2
    from bench.counted import precompile

    precompile()                  # byte-code as an installed fleetspec has it
    bring_up_lab("vs_ansible.py", args.skip_up)
    variables, inventory, watch_at = playbook_vars(args.health_retries)
    work = Path(tempfile.mkdtemp(prefix="fleetspec-vs-ansible-"))
    (work / "vars.json").write_text(json.dumps(variables))
    (work / "inventory.json").write_text(json.dumps(inventory))
    env = {"ANSIBLE_PIPELINING": "1", "ANSIBLE_HOST_KEY_CHECKING": "1", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_RETRY_FILES_ENABLED": "0", "ANSIBLE_LOCAL_TEMP": str(work / "tmp")}

    def ans(play: str, limit: str | None = None) -> tuple[int, float, str]:
        cmd = [args.ansible_playbook, "-i", str(work / "inventory.json"), "-e", f"@{work / 'vars.json'}", str(HERE / play)]
        return timed(cmd, env)

    beside = smoke_root(work, "beside-load", when="beside-load", reuse=False)
    fresh = smoke_root(work, "fresh", reuse=False)
    rows: dict[str, list] = {k: [] for k in ("fs_deploy", "ans_deploy", "fs_rollback", "ans_rollback",
                                             "fs_failed", "ans_failed", "fs_status", "ans_status",
                                             "fs_deploy_down", "fs_deploy_engine", "ans_down",
                                             "fs_failed_down", "ans_failed_down",
                                             "fs_beside", "fs_beside_engine", "fs_beside_down",
                                             "fs_fresh", "fs_fresh_engine", "fs_fresh_down",
                                             "fs_stage_only", "fs_ahead", "fs_ahead_engine", "fs_ahead_down")}

    def need(result, rc: int, what: str) -> float:
        if result[0] != rc:
            raise SystemExit(f"{what}: exit {result[0]}, expected {rc}:\n{result[2]}")
        print(json.dumps({"what": what, "s": round(result[1], 2)}), flush=True)
        return result[1]

    for _ in range(args.warmup):
        need(fs("deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", "--json"), 0, "warm-up: fleetspec deploy")
        need(fs("rollback", HOST, "--json"), 0, "warm-up: fleetspec rollback")
        need(ans("deploy.yml"), 0, "warm-up: ansible deploy")
        need(ans("rollback.yml"), 0, "warm-up: ansible rollback")

    def fs_deploy(root: Path, what: str, rows_as: str | None) -> None:
        """A fleetspec deploy and its rollback; its time, downtime and engine wait kept under `rows_as`."""
        r, down = watched(*watch_at, lambda: fs("deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", "--json",
                                                root=root))
        took = need(r, 0, what)
        if rows_as:
            rows[rows_as].append(took)
            rows[rows_as + "_down"].append(down)
            rows[rows_as + "_engine"].append(json.loads(r[2].strip().splitlines()[-1])["engine_wait_s"])
        rollback = need(fs("rollback", HOST, "--json", root=root), 0, f"{what}: its rollback")
        if rows_as == "fs_deploy":
            rows["fs_rollback"].append(rollback)

    for _ in range(args.runs):
        r, down = watched(*watch_at, lambda: ans("deploy.yml"))
        rows["ans_deploy"].append(need(r, 0, "ansible deploy"))
        rows["ans_down"].append(down)
        rows["ans_rollback"].append(need(ans("rollback.yml"), 0, "ansible rollback"))
        # Ansible patched sglang in place and restored it: the install changed, so the default's
        # next deploy runs its smoke tests (and keeps the verdict), and only the one after replays.
        fs_deploy(fresh, "fleetspec deploy, smoke.reuse: false", "fs_fresh")
        fs_deploy(beside, "fleetspec deploy, smoke beside the load", "fs_beside")
        rows["fs_stage_only"].append(need(fs("deploy", HOST, "--algo", "ddtree", "--stage-only", "--json", root=fresh),
                                          0, "fleetspec deploy --stage-only, smoke.reuse: false"))
        fs_deploy(fresh, "fleetspec deploy of the release staged ahead", "fs_ahead")
        fs_deploy(ROOT, "fleetspec deploy (the default), its smoke tests run after Ansible's change", None)
        fs_deploy(ROOT, "fleetspec deploy (the default), smoke verdict replayed", "fs_deploy")
        rows["fs_status"].append(need(fs("status", HOST, OTHER, "--json"), 0, "fleetspec status"))
        rows["ans_status"].append(need(ans("status.yml"), 0, "ansible status"))
    need(fs("lab", "fault", HOST, "crash_at_start", "only_algorithm=DDTREE"), 0, "lab fault")
    try:
        for _ in range(args.runs):
            r, down = watched(*watch_at, lambda: fs("deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", "--json"))
            rows["fs_failed"].append(need(r, 1, "fleetspec failed deploy"))
            rows["fs_failed_down"].append(down)
            r, down = watched(*watch_at, lambda: ans("deploy.yml"))
            rows["ans_failed"].append(need(r, 2, "ansible failed deploy"))
            rows["ans_failed_down"].append(down)
    finally:
        fs("lab", "fault", HOST, "--clear")
    finish(rows, args)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def finish(rows: dict, args: argparse.Namespace) -> None:
    """The run's JSON line and tables; with --json, the result file bench/plots.py draws."""
    figures = {"medians": medians(rows), "runs": rows, "health_retries": args.health_retries}
    print(json.dumps(figures), flush=True)
    print(table(figures["medians"], args.runs))
    if args.json:
        from bench import resultfile

        resultfile.write(args.json, figures, runs=args.runs)


def report(data: dict) -> str:
    """The tables of a run: from its runs when it has them, else from its medians."""
    rows = data.get("runs")
    return table(medians(rows), len(rows["fs_deploy"])) if rows else table(data["medians"], data["meta"]["runs"])


def load(path: Path) -> dict:
    """A --json file, or the printed output of a run (its `{"medians"` line)."""
    text = path.read_text()
    if text.lstrip().startswith("{") and '"meta"' in text[:200]:
        return json.loads(text)
    return next(json.loads(line) for line in text.splitlines() if line.startswith('{"medians"'))


def medians(rows: dict) -> dict:
    return {**{k: statistics.median(v) for k, v in rows.items()}, "engine_load": engine_load(rows)}


def engine_load(rows: dict) -> float:
    """The engine's restart and load as fleetspec waited for it, pooled over every deploy whose
    smoke verdict was read before the switch (a beside-load deploy's wait starts after its smoke
    step): the one figure each tool's overhead is measured beyond. One row's median alone moved
    with its runs (the wait is counted in ~1 s steps: 8.66, 9.67, 10.67 s in one run)."""
    return statistics.median([*rows["fs_deploy_engine"], *rows["fs_fresh_engine"], *rows["fs_ahead_engine"]])


def table(m: dict, runs: int) -> str:
    load = m["engine_load"]
    lines = [f"Stand-in engine figures on ct129, median of {runs} runs each (after a warm-up round), one run of this script.", "",
             "| task | fleetspec s | Ansible s | ratio |", "|---|---|---|---|"]
    for label, a, b in (("deploy, no gates, smoke run (smoke.reuse: false: a first deploy of new content)",
                         "fs_fresh", "ans_deploy"),
                        ("deploy, no gates, smoke verdict replayed (the default, on a redeploy of the same content)",
                         "fs_deploy", "ans_deploy"),
                        ("deploy, no gates, smoke run beside the load (smoke.when: beside-load, smoke.reuse: false)",
                         "fs_beside", "ans_deploy"),
                        ("deploy, no gates, of a release staged ahead (`deploy --stage-only` before it; its tests ran "
                         "there)", "fs_ahead", "ans_deploy"),
                        ("rollback", "fs_rollback", "ans_rollback"),
                        ("failed deploy (crash at start) until healthy again on NEXTN", "fs_failed", "ans_failed"),
                        ("status, 2 hosts", "fs_status", "ans_status")):
        lines.append(f"| {label} | {m[a]:.2f} | {m[b]:.2f} | {m[a] / m[b]:.2f} |")
    fo, ao = m["fs_fresh"] - load, m["ans_deploy"] - load
    lines += ["", f"Deploy overhead beyond the engine's restart and load ({load:.2f} s, fleetspec's measured wait): "
                  f"Ansible {ao:.2f} s; fleetspec with its smoke tests run before the switch {fo:.2f} s, ratio "
                  f"{fo / ao:.2f} (target ≤ 0.3); with the verdict replayed {m['fs_deploy'] - load:.2f} s, ratio "
                  f"{(m['fs_deploy'] - load) / ao:.2f}; with the tests run beside the load "
                  f"{m['fs_beside'] - load:.2f} s, ratio "
                  f"{(m['fs_beside'] - load) / ao:.2f}; of a release staged ahead {m['fs_ahead'] - load:.2f} s, ratio "
                  f"{(m['fs_ahead'] - load) / ao:.2f} (its `deploy --stage-only`, before the window: "
                  f"{m['fs_stage_only']:.2f} s). (The engine's own wait in each: smoke run "
                  f"{m['fs_fresh_engine']:.2f} s, replayed {m['fs_deploy_engine']:.2f} s, beside the load "
                  f"{m['fs_beside_engine']:.2f} s, staged ahead {m['fs_ahead_engine']:.2f} s.)", "",
              "Service down (ct129's /health not 200, seen from the host every 50 ms) during:", "",
              "| deploy | fleetspec s | Ansible s | ratio | fleetspec beyond the engine's load s | Ansible beyond it s |",
              "|---|---|---|---|---|---|"]
    for label, key in (("smoke run", "fs_fresh_down"), ("smoke verdict replayed", "fs_deploy_down"),
                       ("smoke run beside the load", "fs_beside_down"), ("of a release staged ahead", "fs_ahead_down")):
        lines.append(f"| deploy, no gates, {label} | {m[key]:.2f} | {m['ans_down']:.2f} | {m[key] / m['ans_down']:.2f} "
                     f"| {m[key] - load:.2f} | {m['ans_down'] - load:.2f} |")
    lines.append(f"| failed deploy (crash at start), until NEXTN answers again | {m['fs_failed_down']:.2f} "
                 f"| {m['ans_failed_down']:.2f} | {m['fs_failed_down'] / m['ans_failed_down']:.2f} | - | - |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

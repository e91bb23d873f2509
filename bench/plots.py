"""The benches' figures as pictures: one command renders every plot from the JSON under
bench/results/ into docs/img/, where the manual's performance page shows them.

    python3 bench/plots.py [--results bench/results] [--out docs/img]

| picture | from | made by |
|---|---|---|
| deploy-steps.png: where a deploy's time goes, step by step, beside the engine's load; failed deploys until healthy again | deploy-steps.json | bench/speed.py --json |
| vs-ansible.png: fleetspec against Ansible per task, and the overhead beyond the engine's load | vs-ansible.json | bench/vs_ansible.py --json |
| fleet-size.png: own time and controller CPU against fleet size | fleet-size.json | bench/fleet.py --json |
| rollout-under-load.png: failed client requests, latency and time out of the router in a rollout under load, without and with the router | rollout-under-load.json | bench/rollout_under_load.py --json |

A plot whose JSON is absent is skipped and says so. Every picture names its date, its command and,
for the lab's figures, that they are stand-in engine figures (never a GPU result).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWN, SMOKE, ENGINE, ANSIBLE, BAD = "#3b6ea8", "#e08a2c", "#9aa5b1", "#c0504d", "#b03a2e"


def _footer(fig, meta: dict) -> None:
    label = "stand-in engine figures (the lab's engine, no GPU)" if meta.get("stand_in") else "measured"
    fig.text(0.01, 0.005, f"{label}, {meta.get('date', '?')}\n{meta.get('command', '')}", fontsize=7,
             color="#555555", ha="left", va="bottom")


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=110, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)


def deploy_steps(doc: dict, path: Path) -> None:
    """A one-host deploy's steps as a timeline (each step after the one before), the engine's
    restart and load (the probes step) apart from fleetspec's own work; under it, failed deploys
    split into what came before the restart, detection, the baseline's load and the revert's own time."""
    import matplotlib.pyplot as plt

    steps = doc["steps"]
    fig, (top, low) = plt.subplots(2, 1, figsize=(9, 6.4), gridspec_kw={"height_ratios": [3, 1.4]})
    at = 0.0
    names = list(steps)
    for i, name in enumerate(names):
        s = steps[name]
        colour = ENGINE if name == "probes" else SMOKE if name == "smoke" else OWN
        top.barh(i, max(s, 0.02), left=at, color=colour)
        if s >= 0.5:
            top.text(at + s + 0.15, i, f"{s:.2f} s", va="center", fontsize=8)
        at += s
    top.set_xlim(0, at * 1.1)
    top.set_yticks(range(len(names)), [("probes: engine restart + load" if n == "probes" else n) for n in names])
    top.invert_yaxis()
    top.set_xlabel("seconds from the deploy's first step")
    d = doc["deploy"]
    top.set_title(f"Where a one-host deploy's time goes ({doc.get('host', '?')}): {d['wall']:.1f} s in all, "
                  f"engine {d['engine']:.1f} s, fleetspec's own {d['own']:.1f} s", fontsize=10)
    top.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in (OWN, SMOKE, ENGINE)],
               labels=["fleetspec's own steps", "smoke tests (own; the host's python imports sglang)",
                       "the engine's restart and load"], fontsize=8, loc="upper right")
    faults = doc.get("failed", {})
    for i, f in enumerate(faults.values()):
        before = max(0.0, f["wall"] - f["detect"] - f["revert"])
        parts = [(before, "#c9d6e8", "before the restart"), (f["detect"], BAD, "detection"),
                 (f["load"], ENGINE, "the baseline's load"), (f["overhead"], OWN, "revert's own time")]
        left = 0.0
        for value, colour, label in parts:
            low.barh(i, value, left=left, color=colour, label=label if i == 0 else None)
            left += value
        low.text(left + 0.4, i, f"{f['wall']:.1f} s (revert +{f['overhead']:.2f} s)", va="center", fontsize=8)
    low.set_yticks(range(len(faults)), list(faults))
    low.invert_yaxis()
    low.set_xlabel("seconds until the deploy returns with the baseline healthy again")
    low.set_title("Failed deploys (lab faults), reverted and proved healthy", fontsize=10)
    low.legend(fontsize=7, loc="upper right", ncol=2)
    low.set_xlim(0, max((f["wall"] for f in faults.values()), default=1) * 1.7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _footer(fig, doc["meta"])
    _save(fig, path)


VS_TASKS = [("deploy, tests before the switch", "fs_fresh", "ans_deploy"),
            ("deploy, verdict replayed", "fs_deploy", "ans_deploy"),
            ("deploy, tests beside the load", "fs_beside", "ans_deploy"),
            ("deploy of a release staged ahead", "fs_ahead", "ans_deploy"),
            ("rollback", "fs_rollback", "ans_rollback"),
            ("failed deploy until healthy", "fs_failed", "ans_failed"),
            ("status, 2 hosts", "fs_status", "ans_status")]


def vs_ansible(doc: dict, path: Path) -> None:
    """Per task, fleetspec's seconds beside Ansible's (ratio at the bar); and each deploy's
    overhead beyond the engine's restart and load, the figure a deploy tool adds."""
    import matplotlib.pyplot as plt

    m = doc["medians"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8), gridspec_kw={"width_ratios": [1.25, 1]})
    ys = range(len(VS_TASKS))
    left.barh([y - 0.2 for y in ys], [m[a] for _, a, _ in VS_TASKS], height=0.4, color=OWN, label="fleetspec")
    left.barh([y + 0.2 for y in ys], [m[b] for _, _, b in VS_TASKS], height=0.4, color=ANSIBLE, label="Ansible")
    for y, (_, a, b) in zip(ys, VS_TASKS, strict=True):
        left.text(max(m[a], m[b]) + 0.8, y, f"x{m[a] / m[b]:.2f}", va="center", fontsize=8)
    left.set_yticks(list(ys), [t for t, _, _ in VS_TASKS], fontsize=8)
    left.invert_yaxis()
    left.set_xlim(0, max(m[b] for _, _, b in VS_TASKS) * 1.18)
    left.set_xlabel("seconds (median)")
    left.set_title("Wall time per task (ratio: fleetspec / Ansible)", fontsize=10)
    left.legend(fontsize=8, loc="lower right")
    load = m["engine_load"]
    kinds = [(t, a) for t, a, b in VS_TASKS if b == "ans_deploy"]
    over = [m[a] - load for _, a in kinds] + [m["ans_deploy"] - load]
    labels = [t.removeprefix("deploy, ").removeprefix("deploy ") for t, _ in kinds] + ["Ansible's deploy"]
    right.barh(range(len(over)), over, color=[OWN] * len(kinds) + [ANSIBLE])
    for y, value in enumerate(over):
        ratio = f" (x{value / over[-1]:.2f})" if y < len(kinds) else ""
        right.text(value + 0.15, y, f"{value:.2f} s{ratio}", va="center", fontsize=8)
    right.set_yticks(range(len(over)), labels, fontsize=8)
    right.invert_yaxis()
    right.set_xlim(0, max(over) * 1.45)
    right.set_xlabel(f"seconds beyond the engine's load ({load:.2f} s)")
    right.set_title("A deploy's overhead beyond the engine", fontsize=10)
    fig.suptitle("fleetspec beside an idiomatic Ansible playbook, one host (ct129); "
                 "the playbook runs no smoke tests or gates", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    _footer(fig, doc["meta"])
    _save(fig, path)


def fleet_size(doc: dict, path: Path) -> None:
    """Own time and the controller's CPU per host against the number of hosts deployed at once,
    with what the least-squares line of the controller's CPU (bench/scaling.py's fit) says."""
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(ROOT))
    from bench import scaling

    rows = scaling.series(doc["rows"], "thin") or scaling.series(doc["rows"], "full")
    ns = [r["n"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.3))
    left.plot(ns, [r["deploy_own_s"] for r in rows], "o-", color=OWN, label="own time (lab: hosts share 2 cores)")
    left.plot(ns, [r["steps_s"].get("smoke", 0.0) for r in rows], "s--", color=SMOKE,
              label="of it, the slowest host's smoke step")
    left.axhline(rows[0]["deploy_own_s"], color=ENGINE, ls=":", label="one host's own time")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xticks(ns, [str(n) for n in ns])
    left.set_xlabel("hosts deployed at once")
    left.set_ylabel("seconds")
    left.set_title("A deploy's own time (wall minus the engine's wait)", fontsize=10)
    left.legend(fontsize=8)
    p, q = scaling.fit([(r["n"], r["deploy_client_cpu_s"]) for r in rows])
    right.plot(ns, [r["client_cpu_per_host_s"] for r in rows], "o", color=OWN, label="controller CPU per host-deploy")
    right.plot(ns, [(p + q * n) / n for n in ns], "-", color=OWN, alpha=0.5,
               label=f"per host, CPU(N)/N, from the fit CPU(N) = {p:.2f} + {q:.3f}·N s")
    right.set_xscale("log", base=2)
    right.set_xticks(ns, [str(n) for n in ns])
    right.set_ylim(0, max(r["client_cpu_per_host_s"] for r in rows) * 1.25)
    right.set_xlabel("hosts deployed at once")
    right.set_ylabel("CPU seconds per host (user+sys)")
    right.set_title("The controller's CPU per host", fontsize=10)
    right.legend(fontsize=8, loc="upper right")
    fig.suptitle("Own time and controller CPU against fleet size (thin lab hosts, first deploys)", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    _footer(fig, doc["meta"])
    _save(fig, path)


def rollout_under_load(doc: dict, path: Path) -> None:
    """The same rolling deploy under constant load, without and with the router integration
    (bench/rollout_under_load.py): client requests that failed, latency before and during, and
    each host's time out of the router."""
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    labels = [r["label"].replace("the router integration", "router") for r in runs]
    fig, (fail, lat, out) = plt.subplots(1, 3, figsize=(11, 3.8))
    bars = fail.bar(labels, [r["all"]["failed"] for r in runs], color=[BAD if r["all"]["failed"] else OWN for r in runs])
    fail.bar_label(bars, labels=[f"{r['all']['failed']} of {r['all']['sent']}" for r in runs], fontsize=8)
    fail.set_title("failed client requests", fontsize=9)
    x = range(len(runs))
    width = 0.2
    for k, (phase, q, color) in enumerate([("before", "p50_s", ENGINE), ("before", "p99_s", SMOKE),
                                           ("during", "p50_s", OWN), ("during", "p99_s", BAD)]):
        lat.bar([i + (k - 1.5) * width for i in x], [1000 * r[phase][q] for r in runs], width,
                label=f"{q[:3]} {phase}", color=color)
    lat.set_xticks(list(x), labels)
    lat.set_ylabel("ms")
    lat.set_title("latency before and during the rollout", fontsize=9)
    lat.legend(fontsize=7, loc="lower center", ncol=2)
    hosts = sorted({h for r in runs for h in r["hosts"]})
    for k, r in enumerate(runs):
        out.bar([i + (k - 0.5) * 0.35 for i in range(len(hosts))],
                [r["hosts"].get(h, {}).get("out_of_router_s") or 0.0 for h in hosts], 0.35, label=labels[k],
                color=(ENGINE, OWN)[k % 2])
    out.set_xticks(range(len(hosts)), hosts)
    out.set_ylabel("s")
    out.set_title("time out of the router, per host", fontsize=9)
    out.legend(fontsize=7, loc="lower center")
    for ax in (fail, lat):
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle("A --serial 1 rollout under load (stand-in engine figures)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    _footer(fig, doc["meta"])
    _save(fig, path)


PLOTS = {"deploy-steps": deploy_steps, "vs-ansible": vs_ansible, "fleet-size": fleet_size,
         "rollout-under-load": rollout_under_load}


def render(results: Path, out: Path) -> tuple[list[Path], list[str]]:
    """Every plot whose JSON is in `results`, as PNG in `out`; (written, skipped with why)."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for name, draw in PLOTS.items():
        src = results / f"{name}.json"
        if not src.is_file():
            skipped.append(f"{name}: no {src}")
            continue
        draw(json.loads(src.read_text()), out / f"{name}.png")
        written.append(out / f"{name}.png")
    return written, skipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plots.py: matplotlib is not installed: pip install matplotlib (it is in pyproject's test extras)",
              file=sys.stderr)
        return 2
    written, skipped = render(args.results, args.out)
    for path in written:
        print(f"wrote {path}")
    for why in skipped:
        print(f"skipped {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

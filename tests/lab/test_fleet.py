"""Fleet rollouts and measured gates on the lab: canary, max-fail, throughput and bench.

ct129 (sglang 0.5.13.post1, NEXTN) and ct200 (0.5.23, DFLASH) move together; every test leaves
both on their baselines.
"""

from __future__ import annotations

import json

import pytest

from fleetspec.model import ledger as L
from fleetspec.model.inventory import load_inventory
from fleetspec.model.layout import local_mirror
from tests.lab import reliability_lab as R
from tests.lab.labtools import fs, json_rows, ledger, status_rows

pytestmark = [pytest.mark.lab, pytest.mark.slow]

CANARY, OTHER = "ct129", "ct200"
BASELINE_ALGO = {"ct129": ("NEXTN", "EAGLE"), "ct200": ("DFLASH", "DFLASH")}


def statuses(fleet) -> dict[str, dict]:
    return {row["host"]: row for row in status_rows(fs(fleet, "status", CANARY, OTHER, "--json"))}


@pytest.fixture
def fleet_on_baseline(lab_fleet):
    def reset():
        for host in (CANARY, OTHER):
            fs(lab_fleet, "lab", "fault", host, "--clear", check_rc=0)
            if lab_fleet.run(host, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode == 0:
                fs(lab_fleet, "rollback", host, check_rc=0)
    reset()
    yield lab_fleet
    reset()


def test_fault_on_canary_stops_the_rollout(fleet_on_baseline):
    fleet = fleet_on_baseline
    fs(fleet, "lab", "fault", CANARY, "crash_at_start", "only_algorithm=DDTREE", check_rc=0)
    r = fs(fleet, "deploy", CANARY, OTHER, "--algo", "ddtree", "--canary", "1", "--max-fail", "0", "--yes", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = {o["host"]: o for o in json_rows(r.stdout)}
    assert out[CANARY]["status"] == "rolled_back" and out[CANARY]["failed_step"] == "probes"
    assert out[OTHER]["status"] == "skipped"
    rows = statuses(fleet)
    for host, (declared, served) in BASELINE_ALGO.items():
        assert (rows[host]["algo"], rows[host]["served_algo"], rows[host]["health"]) == (declared, served, "ok"), rows[host]
    assert rows[OTHER]["release"] is None        # never touched


def test_whole_fleet_moves_to_ddtree_with_gate_figures(fleet_on_baseline):
    fleet = fleet_on_baseline
    r = fs(fleet, "deploy", CANARY, OTHER, "--algo", "ddtree", "--canary", "1", "--max-fail", "0", "--yes", "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = {o["host"]: o for o in json_rows(r.stdout)}
    rows = statuses(fleet)
    for host in (CANARY, OTHER):
        assert out[host]["status"] == "healthy"
        assert rows[host]["served_algo"] == "DDTREE" and rows[host]["release_status"] == "healthy"
        figures = out[host]["figures"]
        accept, base = figures["acceptance"]["accept_length"], figures["acceptance"]["baseline_accept_length"]
        if host == OTHER:   # 0.5.23: the real DDTree worker verifies DFlash's linear block (stand-in does too)
            assert accept == base, figures
        else:               # ct129: DFlash's 15-deep block verified linearly (TP=2) beats NEXTN's 3 steps
            assert accept > base, figures
        assert figures["throughput"]["ratio_c1"] > 0 and figures["parity"]["prompts_compared"] == 8
        gates = [e for e in ledger(fleet, host) if e["release"] == out[host]["release"] and e["name"] == "gates"
                 and e["state"] == "ok"]
        assert gates and gates[0]["detail"]["figures"] == figures          # the ledger has every figure
    h = fs(fleet, "history", CANARY, check_rc=0)
    assert "tok/step" in h.stdout               # the headline acceptance figure, with its unit


def _throughput_gate_only(data: dict) -> dict:
    """The playbook's throughput gate alone, at c=1 on 4 requests: what the slow-release test is
    about, without a 4x slowed DDTree also measured for acceptance, parity and c=4."""
    data["gates"] = {"throughput": {**data["gates"]["throughput"], "concurrency": [1], "requests": 4}}
    return data


def test_slow_release_fails_the_throughput_gate_and_reverts(fleet_on_baseline, tmp_path):
    fleet = fleet_on_baseline
    root = R.make_root(tmp_path / "root", fleet.hosts, playbooks={"ddtree.yaml": _throughput_gate_only})
    fs(fleet, "lab", "fault", OTHER, "slow_tokens=4", "only_algorithm=DDTREE", check_rc=0)
    r = R.fs(root, "deploy", OTHER, "--algo", "ddtree", "--yes", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "rolled_back" and out["failed_step"] == "gates"
    assert "throughput fail" in out["reason"]
    assert out["evidence"]["figures"]["throughput"]["ratio_c1"] < 0.4
    row = statuses(fleet)[OTHER]
    assert row["served_algo"] == "DFLASH" and row["health"] == "ok"


def test_bench_shows_ddtree_accepting_more_than_nextn(fleet_on_baseline):
    fleet = fleet_on_baseline
    r = fs(fleet, "bench", CANARY, "--algo", "nextn", "--algo", "ddtree", "--algo", "ddtree:budget=16",
           "--concurrency", "1", "--requests", "8", "--json", check_rc=0)
    rows = json_rows(r.stdout)
    by = {(row["algo"], row["options"].get("budget")): row for row in rows}
    nextn, ddtree, small = by[("nextn", None)], by[("ddtree", None)], by[("ddtree", 16)]
    assert not nextn["error"] and not ddtree["error"] and not small["error"]
    assert ddtree["accept_length"] > nextn["accept_length"]
    assert ddtree["figures"]["tok_s_c1"] > 0 and nextn["figures"]["tok_s_c1"] > 0
    row = statuses(fleet)[CANARY]                     # the host is back where it was
    assert row["algo"] == "NEXTN" and row["release"] is None and row["health"] == "ok"
    # the benchmark releases are superseded on the host and in the fleet root's mirror alike
    on_host = L.parse("\n".join(json.dumps(e) for e in ledger(fleet, CANARY))).releases()
    mirror = local_mirror(fleet.root, load_inventory(fleet.inventory).hosts[CANARY], "sglang-qwen.service") / "ledger.jsonl"
    mirrored = L.parse(mirror.read_text()).releases()
    benched = [rid for rid, state in on_host.items() if state == L.SUPERSEDED]
    assert len(benched) >= 3 and all(mirrored.get(rid) == L.SUPERSEDED for rid in benched), (on_host, mirrored)
    table = fs(fleet, "bench", "--help", check_rc=0)
    assert "ddtree:budget=32" in table.stdout

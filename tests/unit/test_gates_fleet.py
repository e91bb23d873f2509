"""Gate verdicts (pure) and the fleet's batching (pure)."""

from __future__ import annotations

import pytest

from fleetspec.errors import UserError
from fleetspec.model.playbook import AcceptanceGate, Gates, ParityGate, ThroughputGate
from fleetspec.ops.fleet import Strategy
from fleetspec.ops.gates import FAIL, INCONCLUSIVE, PASS, Measurement, at_serving, judge, serving_level


def m(accept=(), tok=None, outputs=None, errors=()):
    return Measurement(outputs=outputs or {}, accept_lengths=list(accept), tokens_per_s=tok or {},
                       errors=list(errors))


OUT = {"a": [1, 2, 3, 4], "b": [5, 6, 7], "c": [8, 9]}


def verdicts(gates, before, after, hybrid=False):
    return {v.name: v for v in judge(gates, before, after, hybrid=hybrid)}


def test_acceptance_floor_and_baseline_tolerance():
    g = Gates(acceptance=AcceptanceGate(min=2.0, vs_baseline_tolerance=0.25))
    assert verdicts(g, m([2.3] * 4), m([3.1] * 4))["acceptance"].verdict == PASS
    low = verdicts(g, m([2.3] * 4), m([1.9] * 4))["acceptance"]
    assert low.verdict == FAIL and "floor" in low.reason
    worse = verdicts(g, m([3.0] * 4), m([2.5] * 4))["acceptance"]
    assert worse.verdict == FAIL and "baseline" in worse.reason


def test_no_data_is_inconclusive_and_blocks_unless_dry_run():
    g = Gates(acceptance=AcceptanceGate(min=2.0))
    v = verdicts(g, None, m([]))["acceptance"]
    assert v.verdict == INCONCLUSIVE and v.blocks
    dry = verdicts(Gates(acceptance=AcceptanceGate(min=2.0, dry_run=True)), None, m([]))["acceptance"]
    assert dry.verdict == INCONCLUSIVE and not dry.blocks


def test_throughput_ratio_per_concurrency():
    g = Gates(throughput=ThroughputGate(min_ratio=0.95, concurrency=(1, 4)))
    ok = verdicts(g, m(tok={1: 100, 4: 300}), m(tok={1: 120, 4: 290}))["throughput"]
    assert ok.verdict == PASS and ok.figures["ratio_c4"] == pytest.approx(0.967, abs=1e-3)
    slow = verdicts(g, m(tok={1: 100, 4: 300}), m(tok={1: 40, 4: 120}))["throughput"]
    assert slow.verdict == FAIL and "0.400" in slow.reason
    assert verdicts(g, None, m(tok={1: 1, 4: 1}))["throughput"].verdict == INCONCLUSIVE
    assert verdicts(g, m(tok={1: 100}), m(tok={1: 100}))["throughput"].verdict == INCONCLUSIVE


@pytest.mark.parametrize("gate, running, want", [
    (ThroughputGate(), 16, (16, "--max-running-requests 16")),
    (ThroughputGate(), 512, (64, "--max-running-requests 512, capped at max_concurrency 64")),
    (ThroughputGate(max_concurrency=8), 16, (8, "--max-running-requests 16, capped at max_concurrency 8")),
    (ThroughputGate(serving_concurrency=24), 16, (24, "serving_concurrency 24")),
    (ThroughputGate(serving_concurrency=0), 16, (None, "serving_concurrency: 0")),
    (ThroughputGate(), None, (None, "no --max-running-requests in the launch and no serving_concurrency")),
])
def test_serving_level_from_the_launch_or_the_playbook_capped(gate, running, want):
    assert serving_level(gate, running) == want


def test_throughput_at_the_serving_concurrency_fails_where_only_it_is_slower():
    """A graph rescaled below the host's load: as fast at concurrency 1, slower at 16. Without the
    serving level the gate passes; with it, it fails and says at which level and why that one."""
    g = Gates(throughput=ThroughputGate(min_ratio=0.6, concurrency=(1,)))
    before, after = m(tok={1: 100, 16: 1200}), m(tok={1: 98, 16: 400})
    assert verdicts(g, before, after)["throughput"].verdict == PASS
    served, serving = at_serving(g, 16)
    assert served.throughput.concurrency == (1, 16) and serving == (16, "--max-running-requests 16")
    v = {x.name: x for x in judge(served, before, after, hybrid=False, serving=serving)}["throughput"]
    assert v.verdict == FAIL and v.blocks
    assert v.reason == ("release/baseline tokens/s 0.333 < 0.6 at concurrency 16 (the host's serving "
                        "concurrency: --max-running-requests 16)")
    assert v.figures["serving_concurrency"] == 16 and v.figures["ratio_c16"] == 0.333
    assert v.figures["serving_concurrency_from"] == "--max-running-requests 16"
    assert at_serving(Gates(throughput=ThroughputGate(concurrency=(1, 4), serving_concurrency=4)), 32)[0] \
        .throughput.concurrency == (1, 4)
    assert at_serving(Gates(), 16) == (Gates(), None)


def test_the_plan_names_the_throughput_gates_levels_and_the_serving_one():
    from types import SimpleNamespace

    from fleetspec.ops.gates import plan_note

    def pf(gates, running, extra=None):
        host = SimpleNamespace(name="h", inventory_path="inv.yaml", vars=SimpleNamespace(extra=extra or {}))
        return SimpleNamespace(playbook=SimpleNamespace(gates=gates), host=host,
                               launch=SimpleNamespace(max_running=running))

    g = Gates(throughput=ThroughputGate(concurrency=(1, 4)))
    assert plan_note(pf(g, 16)) == ("throughput gate at concurrency 1, 4, 16 (16: the host's serving concurrency, "
                                    "--max-running-requests 16)")
    assert plan_note(pf(g, 16, {"gates": {"throughput": {"serving_concurrency": 0}}})) == \
        "throughput gate at concurrency 1, 4; not at the host's serving concurrency (serving_concurrency: 0)"
    assert plan_note(pf(g, None)).endswith("(no --max-running-requests in the launch and no serving_concurrency)")
    assert plan_note(pf(Gates(), 16)) is None


def test_parity_reports_the_first_differing_token():
    g = Gates(parity=ParityGate())
    assert verdicts(g, m(outputs=OUT), m(outputs=OUT))["parity"].verdict == PASS
    bad = dict(OUT, b=[5, 0, 7])
    v = verdicts(g, m(outputs=OUT), m(outputs=bad))["parity"]
    assert v.verdict == FAIL and v.figures["first_difference"] == {"prompt": "b", "token_index": 1,
                                                                   "baseline": 6, "release": 0}


def test_parity_hybrid_tolerance_allows_late_divergence_only_on_hybrid_targets():
    g = Gates(parity=ParityGate(hybrid_tolerance_tokens=2))
    late = dict(OUT, a=[1, 2, 3, 0])
    assert verdicts(g, m(outputs=OUT), m(outputs=late), hybrid=True)["parity"].verdict == PASS
    assert verdicts(g, m(outputs=OUT), m(outputs=late), hybrid=False)["parity"].verdict == FAIL


@pytest.mark.parametrize("total,kw,expected", [
    (5, dict(canary=1, serial="2"), [[0], [1, 2], [3, 4]]),
    (4, dict(canary=0, serial="50%"), [[0, 1], [2, 3]]),
    (3, dict(canary=0, serial="1"), [[0], [1], [2]]),
    (2, dict(canary=5, serial="1"), [[0, 1]]),
])
def test_batches(total, kw, expected):
    s = Strategy.parse(total, max_fail="0", parallel=0, rollback_all_on_abort=False, **kw)
    assert s.batches(list(range(total))) == expected


def test_bad_counts_are_user_errors():
    with pytest.raises(UserError, match="--serial"):
        Strategy.parse(3, canary=0, serial="many", max_fail="0", parallel=0, rollback_all_on_abort=False)
    assert Strategy.parse(10, canary=0, serial="1", max_fail="20%", parallel=0,
                          rollback_all_on_abort=False).max_fail == 2

"""The stand-in's decode loop (fleetspec_lab_engine.decode) with the real DDTree payload: greedy
output equals plain greedy decoding for every algorithm, acceptance is what the drafters and the
deployed tree code really give, and each broken payload (tests/ddtree_mutations.py) changes what
the stand-in emits or accepts, as it would on a GPU."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)   # tiny tensors: the intra-op pool only adds latency on a busy machine

from fleetspec.lab.engine.fleetspec_lab_engine import decode, model
from tests.ddtree_mutations import MUTATIONS, mutate

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = ROOT / "playbooks/ddtree/payload/ddtree_utils.py"
PROMPTS = ["The capital of France is", "Write a Python function that reverses a linked list.",
           "Explain speculative decoding in two sentences.", "def fibonacci(n):",
           "List three prime numbers greater than 100.", "Translate 'good morning' into German."]
DDTREE_ARGS = {"speculative_num_draft_tokens": 16, "speculative_ddtree_budget": 64,
               "speculative_ddtree_topk_cap": 8, "tp_size": 1, "page_size": 1}


def load_payload(source: str | None = None, tag: str = "ok"):
    """ddtree_utils from source text (the shipped payload by default), as its own module."""
    name = f"fleetspec_test_ddtree_utils_{tag}"
    module = types.ModuleType(name)
    module.__file__ = str(PAYLOAD)
    sys.modules[name] = module
    try:
        exec(compile(source if source is not None else PAYLOAD.read_text(), str(PAYLOAD), "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class Worker0513:
    """The rule of 0.5.13.post1's DDTreeWorker._linear_reason, for tests that run without sglang
    (the sglang-marked test in test_lab_engine_dispatch.py calls the deployed one)."""

    def _linear_reason(self, batch, build_custom_mask):
        if self.ddtree_shadow_linear:
            return "shadow-linear"
        if batch.sampling_info is not None and not batch.sampling_info.is_all_greedy:
            return "non-greedy sampling"
        if self.page_size != 1:
            return "page_size > 1"
        return None


class WorkerV2:
    """0.5.23's DDTreeWorkerV2 has no tree path."""


def run(plan, du=None, prompts=PROMPTS, max_new=32, temperature=0.0, seed=0):
    dec = decode.Decoder(plan, 64, du)
    outs, steps = [], []
    for p in prompts:
        gen = torch.Generator().manual_seed(seed) if temperature > 0 else None
        out, st = decode.decode(dec, model.tokenize(p), max_new, temperature, gen)
        outs.append(out)
        steps += st
    return outs, steps


def tokens_per_step(outs, steps):
    return sum(map(len, outs)) / len(steps)


@pytest.fixture(scope="module")
def du():
    return load_payload()


@pytest.fixture(scope="module")
def plain():
    return run(decode.make_plan("NONE", {}))[0]


def test_plain_greedy_is_the_target_one_token_at_a_time(plain):
    seq = model.Sequence(model.tokenize(PROMPTS[0]))
    lm = model.TargetLM()
    want = []
    for _ in range(32):
        tok = lm.greedy(seq.digests[-1])
        want.append(tok)
        seq.extend([tok])
    assert plain[0] == want and len(set(map(tuple, plain))) == len(PROMPTS)


@pytest.mark.parametrize("algo,values", [("EAGLE", {"speculative_num_steps": 3}),
                                         ("DFLASH", {"speculative_num_draft_tokens": 16})])
def test_chain_drafters_keep_greedy_output(plain, algo, values):
    outs, steps = run(decode.make_plan(algo, values))
    assert outs == plain
    assert all(s.verified == s.drafted + 1 == decode.depth_for(algo, values) + 1 for s in steps)


def test_ddtree_tree_mode_keeps_output_and_beats_dflash(plain, du):
    plan = decode.make_plan("DDTREE", DDTREE_ARGS, Worker0513)
    assert plan.greedy_mode == "tree" and plan.build_tree
    outs, steps = run(plan, du)
    assert outs == plain
    assert {s.mode for s in steps} == {"tree"} and all(s.verified == 65 for s in steps)
    dflash_outs, dflash_steps = run(decode.make_plan("DFLASH", {"speculative_num_draft_tokens": 16}))
    eagle = run(decode.make_plan("EAGLE", {"speculative_num_steps": 3}))
    tree, chain = tokens_per_step(outs, steps), tokens_per_step(dflash_outs, dflash_steps)
    assert tree > chain * 1.2 and chain > tokens_per_step(*eagle) > 1.5, (tree, chain)


def test_shadow_linear_builds_trees_and_accepts_exactly_what_dflash_does(plain, du):
    plan = decode.make_plan("DDTREE", {**DDTREE_ARGS, "speculative_ddtree_shadow_linear": True}, Worker0513)
    assert (plan.greedy_mode, plan.build_tree) == ("shadow-linear", True)
    outs, steps = run(plan, du)
    d_outs, d_steps = run(decode.make_plan("DFLASH", {"speculative_num_draft_tokens": 16}))
    assert outs == d_outs == plain
    assert [s.accepted for s in steps] == [s.accepted for s in d_steps]
    assert all(s.tree is not None and s.tree["sizes"] == [65] for s in steps)


@pytest.mark.parametrize("values,worker,mode,builds", [
    ({**DDTREE_ARGS, "tp_size": 2}, Worker0513, "linear", False),           # ct129: TP=2
    ({**DDTREE_ARGS, "page_size": 16}, Worker0513, "linear", True),
    (DDTREE_ARGS, WorkerV2, "linear", False),                                # 0.5.23's worker
    (DDTREE_ARGS, None, "linear", False),                                    # worker not importable
])
def test_ddtree_verifies_linearly_where_the_real_worker_does(plain, du, values, worker, mode, builds):
    plan = decode.make_plan("DDTREE", values, worker)
    assert (plan.greedy_mode, plan.build_tree, plan.sampling_mode) == (mode, builds, "linear"), plan
    outs, steps = run(plan, du, prompts=PROMPTS[:2])
    d_outs, d_steps = run(decode.make_plan("DFLASH", {"speculative_num_draft_tokens": 16}), prompts=PROMPTS[:2])
    assert outs == d_outs and [s.accepted for s in steps] == [s.accepted for s in d_steps]


def test_sampling_ddtree_goes_linear_like_the_worker(du):
    plan = decode.make_plan("DDTREE", DDTREE_ARGS, Worker0513)
    assert plan.sampling_mode == "linear"
    _, steps = run(plan, du, prompts=PROMPTS[:1], temperature=0.8, seed=3)
    assert {s.mode for s in steps} == {"linear"}


def test_sampling_output_is_distributed_as_the_target():
    """Chain speculative sampling is lossless: the first token's frequencies match the target's
    softmax at the prompt (chi-square, 64 tokens, 1500 draws, fixed seeds)."""
    plan = decode.make_plan("EAGLE", {"speculative_num_steps": 3})
    dec = decode.Decoder(plan, 64)
    prompt = model.tokenize(PROMPTS[0])
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(64, dtype=torch.float64)
    for _ in range(1500):
        out, _ = decode.decode(dec, prompt, 1, 1.0, gen)
        counts[out[0]] += 1
    lm = model.TargetLM()
    expected = torch.softmax(lm.logits([model.Sequence(prompt).digests[-1]])[0].double(), -1) * 1500
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 120, chi2     # 63 degrees of freedom: the 1e-4 tail starts near 110


def test_cost_model_is_one_rule_from_work_done():
    one = decode.Step([1], 0, 1, 0, "none")
    chain = decode.Step([1, 2], 1, 16, 15, "chain")
    tree = decode.Step([1, 2], 1, 65, 15, "tree")
    assert decode.step_cost(one) == 1.0
    assert decode.step_cost(chain) == pytest.approx(1 + 0.15 + 0.15)
    assert decode.step_cost(tree) == pytest.approx(1 + 0.64 + 0.15)
    assert decode.step_cost(tree, {"verify_node_cost": 0.0, "draft_token_cost": 0.0}) == 1.0


@pytest.mark.parametrize("name", ["greedy_one_too_many", "mask_sees_sibling"])
def test_broken_walk_or_mask_changes_greedy_output(plain, name):
    bad = load_payload(mutate(PAYLOAD.read_text(), name), name)
    outs, _ = run(decode.make_plan("DDTREE", DDTREE_ARGS, Worker0513), bad)
    assert outs != plain
    # ...and on a host that verifies linearly the broken tree code never decides anything.
    outs, _ = run(decode.make_plan("DDTREE", {**DDTREE_ARGS, "speculative_ddtree_shadow_linear": True},
                                   Worker0513), bad)
    assert outs == plain


def test_wrong_positions_change_greedy_output(plain, du):
    bad = types.SimpleNamespace(**{k: getattr(du, k) for k in du.__all__})
    bad.position_ids = lambda tree, start: du.position_ids(tree, start) + (tree.depth > 1).long()
    outs, _ = run(decode.make_plan("DDTREE", DDTREE_ARGS, Worker0513), bad)
    assert outs != plain


def test_tree_missing_best_children_keeps_output_but_accepts_less(plain, du):
    """A worse tree cannot change greedy output (the walk only takes what the target chose); it
    shows as acceptance, which the acceptance gate checks."""
    bad = load_payload(mutate(PAYLOAD.read_text(), "drops_best_child"), "drops_best_child")
    plan = decode.make_plan("DDTREE", DDTREE_ARGS, Worker0513)
    outs, steps = run(plan, bad)
    good_outs, good_steps = run(plan, du)
    assert outs == plain
    assert tokens_per_step(outs, steps) < 1.6 < 2.0 < tokens_per_step(good_outs, good_steps)


def test_every_mutation_anchor_is_in_the_payload():
    source = PAYLOAD.read_text()
    for name in MUTATIONS:
        assert mutate(source, name) != source


def test_engine_paces_steps_by_the_cost_model_and_reports_what_it_decoded(du, plain, monkeypatch, tmp_path):
    """The server's Engine: /generate's ids are the decode loop's, time follows the cost model."""
    import time

    from fleetspec.lab.engine.fleetspec_lab_engine import engine, settings

    monkeypatch.setattr(settings, "ETC", tmp_path)          # no faults.json
    parsed = types.SimpleNamespace(algorithm="DDTREE", values=dict(DDTREE_ARGS))
    config = {**settings.ENGINE_DEFAULTS, "step_seconds": 0.01}
    eng = engine.Engine(parsed, config, Worker0513, du)
    started = time.monotonic()
    result = eng.generate(model.tokenize(PROMPTS[0]), 32)
    elapsed = time.monotonic() - started
    assert result["ids"] == plain[0]
    _, steps = run(decode.make_plan("DDTREE", DDTREE_ARGS, Worker0513), du, prompts=PROMPTS[:1])
    modelled = sum(0.01 * decode.step_cost(s) for s in steps)
    assert result["verify_ct"] == len(steps) and elapsed >= modelled * 0.95
    assert eng.stats["trees_built"] == len(steps) and eng.stats["steps_by_mode"] == {"tree": len(steps)}
    assert eng.accept_length() == pytest.approx(32 / len(steps))


@pytest.mark.parametrize("values, version, size", [
    ({}, "0.5.13.post1", 160),                                               # sglang's fallback
    ({"max_running_requests": 16}, "0.5.13.post1", 160),                     # 0.5.13 does not cap it
    ({"max_running_requests": 32}, "0.5.23", 32),                            # 0.5.23 caps it
    ({"cuda_graph_max_bs": 9, "max_running_requests": 16}, "0.5.13.post1", 9),
    ({"cuda_graph_max_bs": 160, "cuda_graph_max_bs_decode": 1}, "0.5.23", 1),
    ({"cuda_graph_max_bs": "12"}, "0.5.13.post1", 12),
    ({"cuda_graph_max_bs": 8, "disable_cuda_graph": True}, "0.5.13.post1", 0),
])
def test_graph_size_is_what_the_engine_captures(values, version, size):
    assert decode.graph_size(values, version) == size


def test_steps_with_more_requests_running_than_the_graph_holds_are_slower(monkeypatch, tmp_path):
    """Two requests at once on a graph of 1 run eagerly (graph_miss_factor x the step); on a
    graph of 2 they do not: the stand-in shows what a rescale to 1 costs at concurrency 2."""
    import threading
    import time

    from fleetspec.lab.engine.fleetspec_lab_engine import engine, settings

    monkeypatch.setattr(settings, "ETC", tmp_path)          # no faults.json
    config = {**settings.ENGINE_DEFAULTS, "step_seconds": 0.01, "graph_miss_factor": 3.0}

    def two_at_once(graph_bs: int) -> tuple[float, int]:
        values = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                  "cuda_graph_max_bs": graph_bs}
        eng = engine.Engine(types.SimpleNamespace(algorithm="EAGLE", values=values, version="0.5.13.post1"), config)
        gate = threading.Barrier(2, timeout=60)

        def one():
            # in lockstep after every step, so both count as running for every step however the
            # threads are scheduled on a loaded machine
            gate.wait()
            eng.generate(model.tokenize(PROMPTS[0]), 24, on_step=lambda ids, n: gate.wait())
        started = time.monotonic()
        threads = [threading.Thread(target=one) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.monotonic() - started, eng.stats["steps_without_graph"]

    fits, fits_missed = two_at_once(2)
    beyond, beyond_missed = two_at_once(1)
    _, steps = run(decode.make_plan("EAGLE", {"speculative_num_steps": 3}), prompts=PROMPTS[:1], max_new=24)
    modelled = 0.01 * decode.step_cost(steps[0])        # one step of one request, graph replayed
    # every step but possibly the first of whichever thread entered first (the other may not be
    # counted as running yet; the lockstep starts after step one)
    assert fits_missed == 0 and beyond_missed >= 2 * len(steps) - 1, (beyond_missed, len(steps))
    # the two requests step side by side, each step 3x its modelled time (a lower bound: paced by sleeps)
    assert beyond >= 0.95 * (3 * (len(steps) - 1) + 1) * modelled, (beyond, fits, modelled, len(steps))
    one = engine.Engine(types.SimpleNamespace(algorithm="EAGLE", values={"cuda_graph_max_bs": 1}), config)
    one.generate(model.tokenize(PROMPTS[0]), 8)                      # one request alone fits a graph of 1
    assert one.stats["steps_without_graph"] == 0 and one.graph_size == 1


H200 = 143771.0     # memory.total of the lab's H200 stand-in cases (tests/fixtures/nvidia-smi/health)


@pytest.mark.parametrize("values, version, gpu_mem, explicit, size", [
    ({"tp_size": 2, "max_running_requests": 16}, "0.5.13.post1", H200, False, 256),     # ct129 on 2x H200
    ({"tp_size": 1, "max_running_requests": 32, "cuda_graph_max_bs_decode": 32}, "0.5.23", H200, False, 32),
    ({"tp_size": 1}, "0.5.23", 30 * 1024.0, False, 48),                       # 0.5.23's own 20-35 GiB row
    ({"tp_size": 4}, "0.5.13.post1", 40 * 1024.0, False, 160),
    ({"tp_size": 2, "cuda_graph_max_bs": 15}, "0.5.13.post1", H200, True, 15),  # the operator's (or a rescale's)
])
def test_graph_size_follows_the_gpu_the_stand_in_reports(values, version, gpu_mem, explicit, size):
    """With the lab's nvidia-smi stand-in, sglang's own graph size is the one it picks for that GPU
    (as fleetspec's plan says), not its no-GPU fallback; a size set on the command line is kept."""
    assert decode.graph_size(values, version, gpu_mem, explicit) == size


def test_the_engine_reads_the_gpu_memory_of_the_installed_stand_in(tmp_path):
    """The tables `lab up` lays on a host (lab.gpu.standin_files) give the engine the H200's memory;
    a host without them (gpu=none) has none. And the engine's rows are fleetspec's own."""
    from fleetspec.lab import gpu
    from fleetspec.model import graphsize

    for path, (data, _mode) in gpu.standin_files("h200x1", 0.0, etc=str(tmp_path / "gpu"),
                                                 bin_dir=str(tmp_path / "bin")).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    assert decode.gpu_memory_mib(str(tmp_path / "gpu")) == H200
    assert decode.gpu_memory_mib(str(tmp_path / "none")) is None
    assert decode._BS_ROWS == graphsize._BS_0_5_13 and decode._BS_ROWS_0_5_23 == graphsize._BS_0_5_23
    assert decode.explicit_graph(["--cuda-graph-max-bs=8"]) and not decode.explicit_graph(["--max-running-requests", "8"])

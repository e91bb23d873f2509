"""The cuda-graph rule (fleetspec.model.graphsize) on the corpus's real commands that size the graph,
with the real parsers' option tables of both sglang versions and the ddtree playbook's flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetspec import systemd_unit
from fleetspec.errors import UserError
from fleetspec.model import graphsize, launch
from fleetspec.model.playbook import load_playbook

ROOT = Path(__file__).resolve().parents[2]
CORPUS = yaml.safe_load((ROOT / "tests" / "fixtures" / "execstart_corpus.yaml").read_text())
WITH_FLAG = [c for c in CORPUS if "--cuda-graph-max-bs" in c["unit"] and c["expect"] == "moved"]
DDTREE = ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/models/draft",
          "--speculative-ddtree-budget", "64", "--speculative-ddtree-topk-cap", "8"]
VALUES = {"--speculative-algorithm": "DDTREE", "--speculative-draft-model-path": "/models/draft",
          "--speculative-ddtree-budget": 64, "--speculative-ddtree-topk-cap": 8}     # render_flags' values
T13 = launch.load_table("0.5.13.post1")
T23 = launch.load_table("0.5.23")


def derive(argv: list[str], table, flags=DDTREE):
    form = launch.classify(argv, path=argv[0])
    return launch.derive(form, table, flags, carry=(), version=table.version)


def value_of(argv: list[str], option: str) -> int:
    for i, token in enumerate(argv):
        if token == option:
            return int(argv[i + 1])
        if token.startswith(option + "="):
            return int(token.split("=", 1)[1])
    raise AssertionError(f"{option} not in {argv}")


def test_the_corpus_has_cases_that_size_the_graph():
    assert len(WITH_FLAG) >= 3, [c["id"] for c in WITH_FLAG]


@pytest.mark.parametrize("case", WITH_FLAG, ids=[c["id"] for c in WITH_FLAG])
def test_corpus_graph_sizes_keep_verify_tokens_within_the_baseline(case):
    argv = list(systemd_unit.effective_exec_command(case["unit"]).argv)
    d = derive(argv, T13)
    before_bs = value_of(argv, "--cuda-graph-max-bs")
    width = graphsize.baseline_width(d.dropped, T13, d.algorithm)
    assert width is not None, case["id"]
    sized = graphsize.size(d, T13, "rescale", "h: svc", VALUES)
    after_bs = value_of(sized.derived.argv, "--cuda-graph-max-bs")
    assert after_bs * 65 <= max(before_bs * width, 65)
    assert after_bs <= before_bs and after_bs >= 1
    if after_bs < before_bs:                                  # a changed token, said in the plan
        assert f"--cuda-graph-max-bs {before_bs} -> {after_bs}" in sized.note
        assert sized.derived.changed == [[["--cuda-graph-max-bs", str(before_bs)], ["--cuda-graph-max-bs", str(after_bs)]]]
    others = [t for t in sized.derived.kept if t[0] != "--cuda-graph-max-bs"]
    assert others == [t for t in d.kept if t[0] != "--cuda-graph-max-bs"]   # nothing else moved
    assert len(sized.derived.argv) == len(d.argv)


NEXTN = ["/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "2",
         "--speculative-algo", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]


def test_rescale_of_an_explicit_max_bs_in_both_spellings():
    for spelled in (["--cuda-graph-max-bs", "128"], ["--cuda-graph-max-bs=128"]):
        argv = NEXTN[:5] + spelled + NEXTN[5:]
        sized = graphsize.size(derive(argv, T13), T13, "rescale", "h: svc", VALUES)
        assert value_of(sized.derived.argv, "--cuda-graph-max-bs") == 128 * 4 // 65
        assert sized.derived.argv[:5] == argv[:5] and "-> 7" in sized.note


def test_absent_max_bs_rescales_sglangs_default_and_adds_the_flag():
    sized = graphsize.size(derive(NEXTN, T13), T13, "rescale", "h: svc", VALUES)
    assert sized.derived.added[-2:] == ["--cuda-graph-max-bs", str(160 * 4 // 65)]
    assert "no GPU facts on this host: sglang's fallback" in sized.note


def test_num_steps_with_topk_1_gives_the_width_sglang_derives():
    argv = [t for t in NEXTN if t not in ("--speculative-num-draft-tokens", "4")]
    d = derive(argv + ["--cuda-graph-max-bs", "64"], T13)
    assert graphsize.baseline_width(d.dropped, T13, d.algorithm) == 4


def test_0_5_23_sizes_the_decode_graph_option():
    argv = NEXTN + ["--cuda-graph-max-bs-decode", "256"]
    sized = graphsize.size(derive(argv, T23), T23, "rescale", "h: svc", VALUES)
    assert value_of(sized.derived.argv, "--cuda-graph-max-bs-decode") == 256 * 4 // 65


def test_refuse_is_one_line_naming_the_option_and_keep_changes_nothing():
    argv = NEXTN + ["--cuda-graph-max-bs", "128"]
    d = derive(argv, T13)
    with pytest.raises(UserError) as err:
        graphsize.size(d, T13, "refuse", "ct1: sglang.service", VALUES)
    assert str(err.value).startswith("ct1: sglang.service: --cuda-graph-max-bs 128") and "\n" not in str(err.value)
    assert graphsize.size(d, T13, "keep", "x", VALUES).derived == d


def test_no_change_when_graphs_are_off_or_the_width_is_unknown():
    off = graphsize.size(derive(NEXTN + ["--disable-cuda-graph"], T13), T13, "rescale", "x", VALUES)
    assert off.note is None and "--cuda-graph-max-bs" not in off.derived.argv
    unknown = NEXTN[:5] + ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "8", "--cuda-graph-max-bs", "8"]
    sized = graphsize.size(derive(unknown, T13), T13, "rescale", "x", VALUES)
    assert value_of(sized.derived.argv, "--cuda-graph-max-bs") == 8 and "unknown" in sized.note


def test_the_ddtree_playbook_rescales_from_the_budgets_value():
    """The width comes from the option's value as the playbook rendered it (an int), not from the
    rendered text parsed back."""
    from fleetspec.ops.flags import render_flags

    ddtree = load_playbook(ROOT / "playbooks" / "ddtree.yaml")
    assert ddtree.launch.cuda_graph is None                 # the default: see fleetspec.model.graphsize
    flags = render_flags(ddtree, {"draft_model_path": "/models/draft"},
                         {"budget": 32, "topk_cap": 8, "verify": "tree"})
    assert flags.values["--speculative-ddtree-budget"] == 32 and type(flags.values["--speculative-ddtree-budget"]) is int
    assert graphsize.new_width(flags.values, T13) == 33 and graphsize.new_width({}, T13) is None
    sized = graphsize.size(derive(NEXTN + ["--cuda-graph-max-bs", "128"], T13, flags.argv), T13, "rescale", "x",
                           flags.values)
    assert value_of(sized.derived.argv, "--cuda-graph-max-bs") == 128 * 4 // 33


REAL_0_5_13 = """
import json, types
from sglang.srt.server_args import ServerArgs
out = {}
for mem in (16000, 24000, 40000, 81559, 143771, 183359, None):
    for tp in (1, 2, 4, 8):
        ns = types.SimpleNamespace(chunked_prefill_size=None, cuda_graph_max_bs=None, tp_size=tp, device="cpu",
                                   cuda_graph_bs=None, torch_compile_max_bs=None, piecewise_cuda_graph_max_tokens=1,
                                   context_length=None, piecewise_cuda_graph_tokens=[1], mem_fraction_static=0.88,
                                   enable_symm_mem=False, _generate_cpu_graph_batch_sizes=lambda: [1])
        ServerArgs._handle_gpu_memory_settings(ns, mem)
        out[f"{mem}/{tp}"] = ns.cuda_graph_max_bs
print(json.dumps(out))
"""


def test_sglang_max_bs_is_what_the_real_0_5_13_code_picks():
    """sglang 0.5.13.post1's own _handle_gpu_memory_settings, run in its environment on a stand-in
    object (the method reads only these fields), against fleetspec's table, for every memory row."""
    import json
    import subprocess

    from fleetspec.lab.envs import local_env

    done = subprocess.run([str(local_env("0.5.13.post1")), "-c", REAL_0_5_13], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    real = json.loads(done.stdout.strip().splitlines()[-1])
    for key, bs in real.items():
        mem, tp = key.split("/")
        assert graphsize.sglang_max_bs("0.5.13.post1", None if mem == "None" else float(mem), int(tp)) == bs, key


def test_0_5_23_caps_its_own_choice_at_the_running_requests():
    assert graphsize.sglang_max_bs("0.5.23", 143771, 2, 16) == 16
    assert graphsize.sglang_max_bs("0.5.23", 24000, 2) == 48 and graphsize.sglang_max_bs("0.5.13.post1", 24000, 2) == 24
    assert graphsize.sglang_max_bs("0.5.13.post1", 143771, 2, 16) == 256


H200 = 143771.0
GPUS = {"H200": H200, "A100-40G": 40960.0, "RTX PRO 6000": 97887.0}      # nvidia-smi memory.total, MiB
MOVED = [c for c in CORPUS if c["expect"] == "moved"]


def _real(version: str, script: str) -> dict:
    """Run `script` in that sglang version's own environment; its last line is JSON."""
    import json
    import subprocess

    from fleetspec.lab.envs import local_env

    done = subprocess.run([str(local_env(version)), "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# (token capacity, context length, --max-running-requests, attention-DP ranks)
RUNNING_CASES = ((1_000_000, 131072, None, 1), (3_000_000, 32768, None, 1), (6000, 32768, None, 1),
                 (1_000_000, 131072, 16, 1), (1_000_000, 131072, 128, 8), (1_000_000, 4096, 9000, 2))
# (request pool per rank, the graph's batch sizes)
CAPTURE_CASES = ((8, [1, 2, 4, 8, 16, 32, 256]), (300, [1, 2, 4, 8, 16, 32, 256]), (16, [1, 2, 4, 64]))
REAL_RUNNING = {
    "0.5.13.post1": """
import json, types
from sglang.srt.model_executor import cuda_graph_runner as cgr
from sglang.srt.model_executor.model_runner import ModelRunner
out = {"running": {}, "capture": {}}
for cap, ctx, mrr, dp in %(running)r:
    mr = types.SimpleNamespace(model_config=types.SimpleNamespace(context_len=ctx), dp_size=dp, mambaish_config=None,
                               server_args=types.SimpleNamespace(max_running_requests=mrr))
    out["running"][f"{cap}/{ctx}/{mrr}/{dp}"] = ModelRunner._resolve_max_num_reqs(mr, cap)
# the attention-TP/CP alignment reads torch.distributed state: 1, as on one attention-TP rank
cgr.require_gathered_buffer = lambda server_args: False
cgr.get_attention_tp_size = lambda: 1
cgr.get_attention_cp_size = lambda: 1
for pool, bs in %(capture)r:
    sa = types.SimpleNamespace(cuda_graph_bs=list(bs), enable_two_batch_overlap=False, enable_torch_compile=False)
    capture, _ = cgr.get_batch_sizes_to_capture(
        types.SimpleNamespace(server_args=sa, req_to_token_pool=types.SimpleNamespace(size=pool)), 65)
    out["capture"][f"{pool}/{bs}"] = max(capture)
print(json.dumps(out))
""",
    "0.5.23": """
import json, types
from sglang.srt.mem_cache import kv_cache_configurator as kvc
from sglang.srt.model_executor.runner import base_cuda_graph_runner as bcg
out = {"running": {}, "capture": {}}
for cap, ctx, mrr, dp in %(running)r:
    kvc.get_schedule = lambda mrr=mrr: types.SimpleNamespace(max_running_requests=mrr)    # the published args
    me = types.SimpleNamespace(model_config=types.SimpleNamespace(context_len=ctx), attn_dp_size=dp, mambaish_config=None)
    out["running"][f"{cap}/{ctx}/{mrr}/{dp}"] = kvc.KVCacheConfigurator.resolve_max_num_reqs(me, cap)
bcg.get_cuda_graph_batch_size_alignment = lambda gathered_buffer_required=None: 1
bcg.DllmConfig = types.SimpleNamespace(from_server_args=lambda server_args: None)
bcg.get_flags = lambda: types.SimpleNamespace(capture=types.SimpleNamespace(enable_torch_compile=False))
for pool, bs in %(capture)r:
    bcg.get_exec = lambda bs=bs: types.SimpleNamespace(
        graph=types.SimpleNamespace(cuda_graph_config=types.SimpleNamespace(decode=types.SimpleNamespace(bs=bs)),
                                    torch_compile_max_bs=0),
        overlap=types.SimpleNamespace(enable_two_batch_overlap=False))
    capture, _ = bcg.get_batch_sizes_to_capture(
        types.SimpleNamespace(server_args=None, req_to_token_pool=types.SimpleNamespace(size=pool)), 65)
    out["capture"][f"{pool}/{bs}"] = max(capture)
print(json.dumps(out))
"""}


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.23"])
def test_per_rank_concurrency_and_the_capture_cap_are_what_the_real_code_resolves(version):
    """Each version's own request-pool resolution (per attention-DP rank, with and without
    --max-running-requests) and its capture list (never beyond the request pool: 0.5.13.post1 too),
    run in its environment on stand-in objects, against sglang_max_running and graph_of."""
    real = _real(version, REAL_RUNNING[version] % {"running": RUNNING_CASES, "capture": CAPTURE_CASES})
    for cap, ctx, mrr, dp in RUNNING_CASES:
        assert graphsize.sglang_max_running(version, cap, ctx, mrr, dp) == real["running"][f"{cap}/{ctx}/{mrr}/{dp}"]
        if cap >= 2 * graphsize.RUNNING_FLOOR and mrr is None:                  # the stated bound before start
            assert real["running"][f"{cap}/{ctx}/{mrr}/{dp}"] >= graphsize.per_rank({}, version).value
    table = T13 if version == "0.5.13.post1" else T23
    option = "--cuda-graph-bs" if version == "0.5.13.post1" else "--cuda-graph-bs-decode"
    for pool, bs in CAPTURE_CASES:
        d = derive(NEXTN + ["--max-running-requests", str(pool), option, *map(str, bs)], table)
        named = graphsize.given(d.kept, table)
        graph = graphsize.graph_of(d.kept, table, H200, graphsize.per_rank(named, version))
        assert graph is not None and graph.coverage == real["capture"][f"{pool}/{bs}"], (pool, bs)


REAL_LIST = """
import json, types
from sglang.srt.server_args import ServerArgs
out = {}
for given_bs, max_bs in ((["1", "2", "4", "64"], None), (["1", "2", "4", "64"], 8), (["2", "9"], 256)):
    ns = types.SimpleNamespace(chunked_prefill_size=None, cuda_graph_max_bs=max_bs, tp_size=1, device="cuda",
                               cuda_graph_bs=[int(b) for b in given_bs], torch_compile_max_bs=None,
                               piecewise_cuda_graph_max_tokens=1, context_length=None, piecewise_cuda_graph_tokens=[1],
                               mem_fraction_static=0.88, enable_symm_mem=False)
    ServerArgs._handle_gpu_memory_settings(ns, 143771)
    out[" ".join(given_bs) + f"/{max_bs}"] = ns.cuda_graph_max_bs
print(json.dumps(out))
"""


def test_a_cuda_graph_bs_list_sets_the_max_bs_and_a_rescale_rewrites_the_list():
    """sglang 0.5.13.post1's own _handle_gpu_memory_settings takes the max bs from --cuda-graph-bs over
    --cuda-graph-max-bs; fleetspec reads it so, and a rescale cuts the list instead of adding a
    --cuda-graph-max-bs that sglang would overwrite."""
    real = _real("0.5.13.post1", REAL_LIST)
    for key, bs in real.items():
        sizes, max_bs = key.split("/")
        extra = ["--cuda-graph-bs", *sizes.split()] + ([] if max_bs == "None" else ["--cuda-graph-max-bs", max_bs])
        d = derive(NEXTN + extra, T13)
        graph = graphsize.graph_of(d.kept, T13, H200, graphsize.per_rank(graphsize.given(d.kept, T13), T13.version))
        assert graph is not None and graph.max_bs == bs and graph.explicit == "list", key
    d = derive(NEXTN + ["--cuda-graph-bs", "1", "2", "4", "64"], T13)           # 64 x 4 = 256 tokens; 3 x 65 fit
    sized = graphsize.size(d, T13, "rescale", "x", VALUES)
    assert "--cuda-graph-max-bs" not in sized.derived.argv
    assert sized.derived.changed == [[["--cuda-graph-bs", "1", "2", "4", "64"], ["--cuda-graph-bs", "1", "2", "3"]]]
    assert "--cuda-graph-max-bs 64 (the largest of --cuda-graph-bs 1 2 4 64)" in sized.note
    with pytest.raises(UserError):                                # not set: an operator's list is kept, so refused
        graphsize.size(d, T13, None, "x", VALUES)


def test_sglangs_own_concurrency_without_max_running_requests_keeps_an_explicit_graph():
    """No --max-running-requests: sglang runs 2048 or more per rank, so an explicit --cuda-graph-max-bs 8
    is not cut to 1 (every batch above 1 would then run without graphs): not set, the policy keeps an
    explicit size and refuses in one line saying what fits; `rescale`, the operator's choice, cuts it
    and names what that costs."""
    d = derive(NEXTN + ["--cuda-graph-max-bs", "8"], T13)
    with pytest.raises(UserError) as err:
        graphsize.size(d, T13, None, "ct1: sglang.service", VALUES, gpu_mem=H200)
    said = str(err.value)
    assert "\n" not in said and said.startswith("ct1: sglang.service: --cuda-graph-max-bs 8 (set in the baseline) "
                                                "holds 8 x 4 = 32 verify tokens")
    assert "concurrency at least 2048 per rank (sglang's default without --max-running-requests" in said
    assert "a verify of at most 4 tokens per request (ddtree: --set budget=3)" in said
    assert "no --cuda-graph-max-bs holds even one request of 65 tokens within 32" in said
    assert "launch.cuda_graph: keep" in said and said.endswith("(launch.cuda_graph not set: an explicit graph size is kept)")
    cut = graphsize.size(d, T13, "rescale", "x", VALUES, gpu_mem=H200)
    assert value_of(cut.derived.argv, "--cuda-graph-max-bs") == 1
    assert cut.note.endswith("batches of more than 1 requests per rank now run entirely without CUDA graphs, at up to "
                             "2048 or more at once (launch.cuda_graph: rescale)")
    kept = graphsize.size(d, T13, "keep", "x", VALUES, gpu_mem=H200)
    assert kept.derived == d and "kept (launch.cuda_graph: keep)" in kept.note
    assert graphsize.size(derive(NEXTN, T13), T13, "keep", "x", VALUES).derived == derive(NEXTN, T13)


def test_attention_dp_ranks_each_serve_their_share():
    """--enable-dp-attention --dp-size 8: each rank runs 128 // 8 = 16 and captures its own graph, so
    sglang's 512 on H200 at TP 8 holds 16 x 65 = 1040 <= 2048 and nothing changes; the global 128
    would be a false refusal. Plain --dp-size replicas each get the whole 128."""
    dp = ["--tp-size", "8", "--enable-dp-attention", "--dp-size", "8", "--max-running-requests", "128"]
    d = derive(NEXTN[:5] + dp + NEXTN[7:], T13)
    sized = graphsize.size(d, T13, None, "x", VALUES, gpu_mem=H200)
    assert sized.derived == d
    assert sized.note == ("--cuda-graph-max-bs 512 (sglang 0.5.13.post1's own choice for 143771 MiB GPUs at TP 8) "
                          "covers batches of up to 16 requests per rank, capped at the request pool; concurrency 16 "
                          "per rank (--max-running-requests 128 over 8 attention-DP ranks); the new launch captures "
                          "16 x 65 = 1040 <= 512 x 4 = 2048 verify tokens: --cuda-graph-max-bs kept")
    assert graphsize.per_rank(graphsize.given(derive(NEXTN + ["--dp-size", "8", "--max-running-requests", "128"], T23).kept,
                                              T23), "0.5.23").value == 128
    assert graphsize.per_rank(graphsize.given(derive(NEXTN + ["--attn-dp-size", "4", "--max-running-requests", "128"],
                                                     T23).kept, T23), "0.5.23").value == 32


def test_0_5_13_captures_no_more_than_the_request_pool():
    """8 running requests on H200 at TP 2: 0.5.13.post1 captures 8 of its 256 (the request pool), so
    8 x 65 = 520 fits the 1024 its memory was sized for: nothing to rescale."""
    d = derive(NEXTN + ["--max-running-requests", "8"], T13)
    sized = graphsize.size(d, T13, None, "h: svc", VALUES, gpu_mem=H200)
    assert sized.derived == d
    assert "covers batches of up to 8 requests per rank, capped at the request pool; concurrency 8 per rank " \
        "(--max-running-requests 8)" in sized.note and "8 x 65 = 520 <= 256 x 4 = 1024" in sized.note


def test_below_the_graphs_coverage_is_refused_with_gpu_facts_and_said_without():
    argv = NEXTN + ["--max-running-requests", "16"]
    for policy in (None, "refuse"):
        with pytest.raises(UserError) as err:
            graphsize.size(derive(argv, T13), T13, policy, "ct129: sglang-qwen.service", VALUES, gpu_mem=H200)
        said = str(err.value)
        assert "\n" not in said and said.startswith("ct129: sglang-qwen.service: --cuda-graph-max-bs 256 (sglang "
                                                    "0.5.13.post1's own choice for 143771 MiB GPUs at TP 2) holds "
                                                    "256 x 4 = 1024 verify tokens")
        assert "its graph would capture 16 x 65 = 1040 (it covers 16 requests per rank" in said
        assert "--set budget=63" in said                  # 64 verify tokens x 16 requests = 1024
        assert ("launch.cuda_graph: rescale, to --cuda-graph-max-bs 15 (batches of more than 15 requests per rank "
                "then run entirely without CUDA graphs, at up to 16 at once)") in said
    chosen = graphsize.size(derive(argv, T13), T13, "rescale", "x", VALUES, gpu_mem=H200)
    assert chosen.derived.added[-2:] == ["--cuda-graph-max-bs", "15"] and "(launch.cuda_graph: rescale)" in chosen.note
    lab = graphsize.size(derive(argv, T13), T13, None, "ct129: s", VALUES)          # no GPU facts: the fallback
    assert lab.derived.added[-2:] == ["--cuda-graph-max-bs", "9"]
    assert lab.note.startswith("--cuda-graph-max-bs 160 (no GPU facts on this host: sglang's fallback")
    assert "--cuda-graph-max-bs 160 -> 9 (9 x 65 = 585 <= 640)" in lab.note
    assert "batches of more than 9 requests per rank now run entirely without CUDA graphs, at up to 16 at once" in lab.note
    fits = graphsize.size(derive(NEXTN + ["--cuda-graph-max-bs", "8"], T13, flags=DDTREE[:4] + [
        "--speculative-num-draft-tokens", "4"]), T13, None, "x", {"--speculative-num-draft-tokens": 4}, gpu_mem=H200)
    assert value_of(fits.derived.argv, "--cuda-graph-max-bs") == 8 and "kept" in fits.note   # it fits


def test_a_clamped_rescale_does_not_claim_to_fit():
    sized = graphsize.size(derive(NEXTN + ["--cuda-graph-max-bs", "8"], T13), T13, "rescale", "x", VALUES)
    assert value_of(sized.derived.argv, "--cuda-graph-max-bs") == 1
    assert "65 <= 32" not in sized.note and "(the smallest graph: 1 x 65 = 65 is still more than 32)" in sized.note


@pytest.mark.parametrize("gpu", list(GPUS))
def test_with_gpu_facts_no_corpus_launch_loses_graph_coverage_without_a_refusal(gpu):
    """Every moved launch of the corpus, on each GPU kind, under each policy: refused, or its graph
    covers as many requests per rank as the baseline's (`rescale`: or the note names the batches
    that lose it); not set, an explicit size is never changed."""
    checked = 0
    for case in MOVED:
        try:
            argv = list(systemd_unit.effective_exec_command(case["unit"]).argv)
        except systemd_unit.NeedsHostEnvironment:
            continue
        checked += 1
        for table in (T13, T23):
            try:
                d = derive(argv, table)
            except launch.LaunchRefused:
                continue
            running = graphsize.per_rank(graphsize.given(d.kept, table), table.version)
            before = graphsize.graph_of(d.kept, table, GPUS[gpu], running)
            for policy in (None, "rescale", "refuse", "keep"):
                try:
                    sized = graphsize.size(d, table, policy, "x", VALUES, gpu_mem=GPUS[gpu])
                except UserError:
                    continue
                final = [*sized.derived.kept, *graphsize._pairs(sized.derived.added)]      # an added flag too
                after = graphsize.graph_of(final, table, GPUS[gpu], running)
                assert before is not None and after is not None
                if policy == "rescale" and after.coverage < before.coverage:      # chosen, and said
                    assert "run entirely without CUDA graphs" in sized.note, (case["id"], table.version)
                    continue
                assert after.coverage >= before.coverage, (case["id"], table.version, policy)
                if policy is None and before.explicit:
                    assert sized.derived == d, (case["id"], table.version)
    assert checked >= 30, checked


def test_the_plan_says_the_per_rank_concurrency_the_coverage_and_their_sources():
    """plan_launch (what --plan prints as notes) on ct129's baseline with the ddtree playbook: the
    graph's coverage and the per-rank concurrency with where each came from, with and without GPU
    facts."""
    from fleetspec.lab.profiles import CT129_ARGV
    from fleetspec.ops import argv as argv_ops
    from fleetspec.ops.flags import render_flags

    ddtree = load_playbook(ROOT / "playbooks" / "ddtree.yaml")
    form = launch.classify(list(CT129_ARGV), path=CT129_ARGV[0])
    flags = render_flags(ddtree, {"draft_model_path": "/models/draft"}, {"budget": 15, "topk_cap": 8, "verify": "tree"})
    plan = argv_ops.plan_launch(form, T13, flags, ddtree, "0.5.13.post1", {}, "ct129: sglang-qwen.service",
                                gpu_mem=H200)
    assert ("cuda graph: --cuda-graph-max-bs 256 (sglang 0.5.13.post1's own choice for 143771 MiB GPUs at TP 2) "
            "covers batches of up to 16 requests per rank, capped at the request pool; concurrency 16 per rank "
            "(--max-running-requests 16); the new launch captures 16 x 16 = 256 <= 256 x 4 = 1024 verify tokens: "
            "--cuda-graph-max-bs kept") in plan.notes
    assert "--cuda-graph-max-bs" not in plan.derived.argv
    lab = argv_ops.plan_launch(form, T13, flags, ddtree, "0.5.13.post1", {}, "ct129: sglang-qwen.service")
    note = next(n for n in lab.notes if n.startswith("cuda graph: "))
    assert "(no GPU facts on this host" in note and "concurrency 16 per rank (--max-running-requests 16)" in note


def test_sglang_versions_are_ordered_as_pep_440_orders_them():
    """Both version rules read a version as packaging (PEP 440) does: a pre-release comes before
    its release, a post-release after it; a string that is no version is neither."""
    assert not launch.serve_positional("0.5.23rc1") and not launch.serve_positional("0.5.22")
    assert launch.serve_positional("0.5.23") and launch.serve_positional("0.5.23.post1")
    assert not launch.serve_positional("not-a-version")
    older = graphsize.sglang_max_bs("0.5.13.post1", 24000, 2)
    assert graphsize.sglang_max_bs("0.5.14rc1", 24000, 2) == older == 24
    assert graphsize.sglang_max_bs("0.5.14", 24000, 2) == 48

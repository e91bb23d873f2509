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
    assert ddtree.launch.cuda_graph == "rescale"
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


def test_sizing_from_gpu_facts_shows_the_real_size_and_the_arithmetic():
    argv = NEXTN + ["--max-running-requests", "8"]
    sized = graphsize.size(derive(argv, T13), T13, "rescale", "h: svc", VALUES, gpu_mem=H200)
    assert sized.derived.added[-2:] == ["--cuda-graph-max-bs", "15"]
    assert sized.note == ("--cuda-graph-max-bs 256 (sglang 0.5.13.post1's own choice for 143771 MiB GPUs at TP 2) "
                          "holds 256 x 4 = 1024 verify tokens; the new launch verifies 65 per request: "
                          "--cuda-graph-max-bs 256 -> 15 (15 x 65 = 975 <= 1024)")


def test_below_the_serving_concurrency_is_refused_with_gpu_facts_and_said_without():
    argv = NEXTN + ["--max-running-requests", "16"]
    with pytest.raises(UserError) as err:
        graphsize.size(derive(argv, T13), T13, "rescale", "ct129: sglang-qwen.service", VALUES, gpu_mem=H200)
    said = str(err.value)
    assert "\n" not in said and said.startswith("ct129: sglang-qwen.service: --cuda-graph-max-bs 256 (")
    assert "15 requests per graph fit, below the 16 the host serves at once" in said
    assert "--set budget=63" in said                  # 64 verify tokens x 16 requests = 1024
    lab = graphsize.size(derive(argv, T13), T13, "rescale", "ct129: s", VALUES)          # no GPU facts: the fallback
    assert lab.derived.added[-2:] == ["--cuda-graph-max-bs", "9"]
    assert "no GPU facts" in lab.note and "below the 16 the host serves at once" in lab.note
    explicit = graphsize.size(derive(NEXTN + ["--cuda-graph-max-bs", "8"], T13), T13, "rescale", "x", VALUES, gpu_mem=H200)
    assert value_of(explicit.derived.argv, "--cuda-graph-max-bs") == 1 and "set in the baseline" in explicit.note
    fits = graphsize.size(derive(NEXTN + ["--cuda-graph-max-bs", "8"], T13, flags=DDTREE[:4] + [
        "--speculative-num-draft-tokens", "4"]), T13, "rescale", "x", {"--speculative-num-draft-tokens": 4}, gpu_mem=H200)
    assert fits.note is None and value_of(fits.derived.argv, "--cuda-graph-max-bs") == 8   # kept: it fits


def test_sglang_versions_are_ordered_as_pep_440_orders_them():
    """Both version rules read a version as packaging (PEP 440) does: a pre-release comes before
    its release, a post-release after it; a string that is no version is neither."""
    assert not launch.serve_positional("0.5.23rc1") and not launch.serve_positional("0.5.22")
    assert launch.serve_positional("0.5.23") and launch.serve_positional("0.5.23.post1")
    assert not launch.serve_positional("not-a-version")
    older = graphsize.sglang_max_bs("0.5.13.post1", 24000, 2)
    assert graphsize.sglang_max_bs("0.5.14rc1", 24000, 2) == older == 24
    assert graphsize.sglang_max_bs("0.5.14", 24000, 2) == 48

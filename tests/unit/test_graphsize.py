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
    assert "sglang default" in sized.note


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

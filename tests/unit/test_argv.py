"""Reading the algorithm back from ct129's real ExecStart; resolving options and rendering flags."""

import pytest

from fleetspec.errors import UserError
from fleetspec.model.overrides import parse_overrides
from fleetspec.model.playbook import load_playbook
from fleetspec.ops.argv import speculative_algorithm_from_argv
from fleetspec.ops.flags import render_flags
from fleetspec.ops.options import resolve_options

CT129 = ("/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3.6-27B "
         "--port 30000 --host 0.0.0.0 --tp-size 2 --mem-fraction-static 0.88 --context-length 131072 "
         "--max-running-requests 16 --mamba-full-memory-ratio 0.5 --mamba-scheduler-strategy extra_buffer "
         "--reasoning-parser qwen3 --tool-call-parser qwen3_coder --speculative-algo NEXTN "
         "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4").split()


@pytest.mark.parametrize("argv,expected", [
    (CT129, "NEXTN"),
    (["/py", "--speculative-algorithm", "EAGLE3"], "EAGLE3"),
    (["/py", "--speculative-algorithm=DFLASH"], "DFLASH"),
    (["/py", "--speculative-algo=DDTREE"], "DDTREE"),
    (["/py", "--speculative-al", "NGRAM"], "NGRAM"),
    (["/py", "--speculative-algorithm", "A", "--speculative-algo", "B"], "B"),
    (["/py", "--speculative-num-steps", "3"], None),
    (["/py", "--speculative-a", "X"], None),  # ambiguous with --speculative-accept-*
    (["/py", "--port", "1"], None),
])
def test_speculative_algorithm_from_argv(argv, expected):
    assert speculative_algorithm_from_argv(argv) == expected


DDTREE = """\
algo: ddtree
speculative_algorithm: DDTREE
options: {budget: 64, topk_cap: 8, verify: auto, ratio: 0.5, trace: false}
hybrid: {option: verify, auto: shadow-linear, refuse: [tree], otherwise: tree}
launch:
  flags:
    - [--speculative-algorithm, DDTREE]
    - [--speculative-draft-model-path, "{{ host.draft_model_path }}"]
    - [--speculative-ddtree-budget, "{{ options.budget }}"]
    - {flag: [--speculative-ddtree-shadow-linear], when: "options.verify == 'shadow-linear'"}
    - {flag: [--speculative-ddtree-trace], when: "options.trace"}
"""


@pytest.fixture
def ddtree(tmp_path):
    (tmp_path / "ddtree.yaml").write_text(DDTREE)
    return load_playbook(tmp_path / "ddtree.yaml")


HOST = {"draft_model_path": "/root/models/Qwen3.6-27B-DFlash", "model_path": "/m"}


def test_render_hybrid_auto_becomes_shadow_linear(ddtree):
    resolved = resolve_options(ddtree, {}, hybrid=True)
    assert resolved.values["verify"] == "shadow-linear"
    assert "hybrid" in resolved.notes[0]
    assert render_flags(ddtree, HOST, resolved.values).argv == [
        "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/root/models/Qwen3.6-27B-DFlash",
        "--speculative-ddtree-budget", "64", "--speculative-ddtree-shadow-linear"]


def test_render_pure_attention_auto_becomes_tree_and_overrides_are_typed(ddtree):
    overrides = parse_overrides(ddtree, ["budget=32", "trace=yes", "ratio=0.25"])
    assert overrides == {"budget": 32, "trace": True, "ratio": 0.25}
    resolved = resolve_options(ddtree, overrides, hybrid=False)
    flags = render_flags(ddtree, HOST, resolved.values).argv
    assert resolved.values["verify"] == "tree"
    assert "--speculative-ddtree-shadow-linear" not in flags
    assert flags[-1] == "--speculative-ddtree-trace" and "32" in flags


def test_hybrid_refuses_tree(ddtree):
    with pytest.raises(UserError, match="refused on a hybrid target"):
        resolve_options(ddtree, {"verify": "tree"}, hybrid=True)
    assert resolve_options(ddtree, {"verify": "tree"}, hybrid=False).values["verify"] == "tree"


@pytest.mark.parametrize("pairs,expected", [
    (["trace=on"], {"trace": True}), (["trace=OFF"], {"trace": False}), (["trace= Yes "], {"trace": True}),
    (["trace=0"], {"trace": False}), ([" budget =32"], {"budget": 32}), (["ratio=1e-2"], {"ratio": 0.01}),
    (["verify="], {"verify": ""}), (["budget=8", "budget=16"], {"budget": 16})])
def test_override_semantics(ddtree, pairs, expected):
    """The one `--set` parser: YAML-1.1 style booleans in any case, names stripped, the last one wins."""
    assert parse_overrides(ddtree, pairs) == expected


@pytest.mark.parametrize("pair,msg", [("budget=lots", "expected int"), ("nosuch=1", "no option"),
                                      ("trace=maybe", "expected bool"), ("budget", "NAME=VALUE"),
                                      ("ratio=inf", "expected float"), ("ratio=NaN", "expected float"),
                                      ("budget=1.5", "expected int"), ("=3", "NAME=VALUE")])
def test_bad_overrides(ddtree, pair, msg):
    with pytest.raises(UserError, match=msg):
        parse_overrides(ddtree, [pair])


def test_undefined_host_var_is_one_line(ddtree):
    with pytest.raises(UserError, match="draft_model_path"):
        render_flags(ddtree, {"model_path": "/m"}, resolve_options(ddtree, {}, True).values)
    with pytest.raises(UserError, match="rendered empty"):
        render_flags(ddtree, {"draft_model_path": None}, resolve_options(ddtree, {}, True).values)

"""Playbook schema: a full playbook loads into typed data; mistakes name file, key and expectation."""

import pytest

from fleetspec.errors import ConfigError, UserError
from fleetspec.model.playbook import load_playbook, load_playbook_for

FULL = """\
algo: ddtree
speculative_algorithm: DDTREE
description: Tree-shaped speculative decoding on top of DFlash
options: {budget: 64, topk_cap: 8, verify: auto}
hybrid: {option: verify, auto: shadow-linear, refuse: [tree], otherwise: tree}
launch:
  flags:
    - [--speculative-algorithm, DDTREE]
    - [--speculative-ddtree-budget, "{{ options.budget }}"]
    - {flag: [--speculative-ddtree-shadow-linear], when: "options.verify == 'shadow-linear'"}
  env: {SGLANG_DDTREE_LOG: "0"}
  secret_env: []
patchsets:
  0.5.13.post1: ddtree/patchsets/sglang-0.5.13.post1
  0.5.23: ddtree/patchsets/sglang-0.5.23
kernels: [ddtree/kernels/tree_mask]
smoke: {imports: [sglang.srt.speculative.ddtree_utils], parse_args: true, kernels: true, ddtree_sample: true}
probes: {ready_timeout: 900, interval: 0.5, generate: {prompt: "The capital of France is", max_new_tokens: 16}}
gates:
  acceptance: {min: 2.0, vs_baseline_tolerance: 0.25, dry_run: false}
  throughput: {min_ratio: 0.95, concurrency: [1, 4], requests: 16, dry_run: false}
  parity: {max_new_tokens: 32, hybrid_tolerance_tokens: 0, dry_run: false}
"""


@pytest.fixture
def pdir(tmp_path):
    d = tmp_path / "playbooks"
    for sub in ("ddtree/patchsets/sglang-0.5.13.post1", "ddtree/patchsets/sglang-0.5.23", "ddtree/kernels/tree_mask"):
        (d / sub).mkdir(parents=True)
    (d / "ddtree/kernels/tree_mask/kernel.json").write_text("{}")
    (d / "ddtree.yaml").write_text(FULL)
    return d


def test_full_playbook_loads(pdir):
    pb = load_playbook_for(pdir.parent, "ddtree")
    assert pb.speculative_algorithm == "DDTREE" and pb.options["budget"] == 64
    assert pb.hybrid.auto == "shadow-linear" and pb.hybrid.refuse == ("tree",)
    assert pb.launch.flags[2].when and pb.launch.env["SGLANG_DDTREE_LOG"] == "0"
    assert pb.patchset_for("0.5.23") == pdir / "ddtree/patchsets/sglang-0.5.23"
    assert pb.kernels == (pdir / "ddtree/kernels/tree_mask",)
    assert pb.gates.throughput.concurrency == (1, 4) and pb.probes.generate.max_new_tokens == 16
    assert pb.gates.throughput.serving_concurrency is None and pb.gates.throughput.max_concurrency == 64
    assert pb.smoke.ddtree_sample is True and pb.smoke.when == "before-switch" and pb.smoke.reuse is True


def test_smoke_beside_the_load_moves_its_verdict_after_the_restart(pdir):
    from fleetspec.ops.steps import plan_lines as step_order

    (pdir / "ddtree.yaml").write_text(FULL.replace("ddtree_sample: true}", "ddtree_sample: true, when: beside-load}"))
    pb = load_playbook_for(pdir.parent, "ddtree")
    assert pb.smoke.when == "beside-load"
    before, beside = step_order("before-switch"), step_order(pb.smoke.when)
    assert before.index("smoke (their verdict)") < before.index("switch")
    assert beside.index("restart") < beside.index("smoke (their verdict, beside the engine's load)") < beside.index("probes")
    assert sorted(step.split(" ")[0] for step in before) == sorted(step.split(" ")[0] for step in beside)


def test_minimal_playbook(tmp_path):
    (tmp_path / "nextn.yaml").write_text("algo: nextn\nspeculative_algorithm: EAGLE\n"
                                         "launch: {flags: [[--speculative-algorithm, NEXTN], [--speculative-num-steps, 3]]}\n")
    pb = load_playbook(tmp_path / "nextn.yaml")
    assert pb.launch.flags[1].tokens == ("--speculative-num-steps", "3")
    assert pb.hybrid is None and pb.patchsets == {} and pb.gates.parity is None


def test_unknown_algo_lists_known(pdir):
    with pytest.raises(UserError, match=r"unknown algo 'eagle9'.*known: ddtree"):
        load_playbook_for(pdir.parent, "eagle9")


@pytest.mark.parametrize("old,new,match", [
    ("budget: 64", "budget: [64]", r"options\.budget: expected"),
    ("ready_timeout: 900", "ready_timeout: soon", r"probes\.ready_timeout: expected a number"),
    ("sglang-0.5.23\n", "sglang-0.5.99\n", r"patchsets\.0\.5\.23: folder .*sglang-0.5.99 not found"),
    ("kernels: [ddtree/kernels/tree_mask]", "kernels: [ddtree/kernels/nope]", r"kernels\[0\]: folder"),
    ("option: verify", "option: verif", r"hybrid\.option: expected the name of an option"),
    ("parse_args: true", "parse_arg: true", r"smoke\.parse_arg: unknown key"),
    ("parse_args: true", "parse_args: true, when: later", r"smoke\.when: expected one of before-switch, beside-load"),
    ("parse_args: true", "parse_args: true, reuse: sometimes", r"smoke\.reuse: expected"),
    ("algo: ddtree", "algo: dflash", r"algo: expected 'ddtree'"),
    ("    - [--speculative-algorithm, DDTREE]", "    - [speculative-algorithm, DDTREE]", r"launch\.flags\[0\]\[0\]"),
    ("concurrency: [1, 4]", "concurrency: [1, 0]", r"gates\.throughput\.concurrency\[1\]"),
    ("requests: 16,", "requests: 16, serving_concurrency: -1,", r"gates\.throughput\.serving_concurrency: expected a count"),
    ("requests: 16,", "requests: 16, serving_concurrency: many,", r"gates\.throughput\.serving_concurrency: expected"),
    ("requests: 16,", "requests: 16, max_concurrency: 0,", r"gates\.throughput\.max_concurrency: expected a positive"),
    ("speculative_algorithm: DDTREE\n", "", r"speculative_algorithm: missing"),
])
def test_bad_playbooks(pdir, old, new, match):
    path = pdir / "ddtree.yaml"
    assert old in FULL
    path.write_text(FULL.replace(old, new))
    with pytest.raises(ConfigError, match=match) as err:
        load_playbook(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)

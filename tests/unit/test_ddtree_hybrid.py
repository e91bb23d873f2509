"""The hybrid-target guard: fleetspec's preflight rule and the payload's launcher rule agree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fleetspec.model import payload
from fleetspec.model.hybrid import hybrid_reason, is_hybrid_config


def _load():
    return payload.load("ddtree_config")


dc = _load()

HYBRID = [
    {"model_type": "qwen3_next", "full_attention_interval": 4},
    {"model_type": "qwen3_5", "text_config": {"layer_types": ["linear_attention", "full_attention"]}},
    {"model_type": "custom", "layer_types": ["full_attention", "linear_attention"]},
    {"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*-"},
    {"model_type": "x", "hybrid_override_pattern": "M-M*-"},
    {"model_type": "x", "layers_block_type": ["mamba", "attention"]},
    {"model_type": "x", "mamba_d_state": 16},
    {"model_type": "llava", "text_config": {"model_type": "jamba"}},
]
PLAIN = [
    {"model_type": "qwen3", "layer_types": ["full_attention"] * 4},
    {"model_type": "gemma3", "layer_types": ["sliding_attention", "full_attention"]},
    {"model_type": "llama"},
    {},
    {"model_type": "qwen2_vl", "text_config": {"model_type": "qwen2"}},
]


@pytest.mark.parametrize("config", HYBRID)
def test_hybrid_configs(config):
    assert is_hybrid_config(config)
    assert dc.hybrid_reason(config) == hybrid_reason(config)


@pytest.mark.parametrize("config", PLAIN)
def test_pure_attention_configs(config):
    assert not is_hybrid_config(config) and dc.hybrid_reason(config) is None


def test_preflight_and_the_payload_share_one_definition_of_the_rule():
    """The rule is written once, in the payload (which cannot import fleetspec); preflight and the
    model_config fact run that very code."""
    from fleetspec.model import hybrid
    from fleetspec.remote.facts import model_config

    source = str(payload.PAYLOAD_DIR / "ddtree_config.py")
    assert hybrid.hybrid_reason is dc.hybrid_reason and hybrid.hybrid_reason.__code__.co_filename == source
    assert hybrid.HYBRID_MODEL_TYPES is dc.HYBRID_MODEL_TYPES
    assert "import fleetspec" not in Path(source).read_text() and "from fleetspec" not in Path(source).read_text()
    assert model_config.is_hybrid_config is hybrid.is_hybrid_config
    assert model_config.parse(json.dumps(HYBRID[1])).is_hybrid and not model_config.parse(json.dumps(PLAIN[0])).is_hybrid


def test_preflight_module_does_not_import_torch():
    source = Path(sys.modules["fleetspec.model.hybrid"].__file__).read_text()
    assert "torch" not in source.split('"""', 2)[2]


def _model(tmp_path, config) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_launcher_refuses_tree_verification_on_a_hybrid_target(tmp_path):
    model = _model(tmp_path, HYBRID[1])
    with pytest.raises(ValueError, match="hybrid target .*--speculative-ddtree-shadow-linear"):
        dc.check_ddtree_args(algorithm="DDTREE", budget=32, topk_cap=8, shadow_linear=False, model_path=model)
    got = dc.check_ddtree_args(algorithm="ddtree", budget=None, topk_cap=None, shadow_linear=True, model_path=model)
    assert got["budget"] == dc.DEFAULT_BUDGET and got["shadow_linear"] and "qwen3_5" in got["hybrid"]


def test_launcher_accepts_trees_on_pure_attention_and_refuses_stray_flags(tmp_path):
    model = _model(tmp_path, PLAIN[0])
    assert dc.check_ddtree_args(algorithm="DDTREE", budget=16, topk_cap=None, shadow_linear=False,
                                model_path=model)["hybrid"] is None
    with pytest.raises(ValueError, match="need --speculative-algorithm DDTREE"):
        dc.check_ddtree_args(algorithm="DFLASH", budget=16, topk_cap=None, shadow_linear=False, model_path=model)
    assert dc.check_ddtree_args(algorithm=None, budget=None, topk_cap=None, shadow_linear=False, model_path=model) == {}


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1.5"])
def test_budget_type_refuses_bad_values(value):
    import argparse

    parser = argparse.ArgumentParser(prog="x")
    dc.add_ddtree_args(parser)
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["--speculative-ddtree-budget", value])
    assert err.value.code == 2

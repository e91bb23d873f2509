"""Is a target model hybrid (recurrent or linear-attention layers beside attention)?

DDTree verifies many branches in one pass; recurrent state (Mamba, GatedDeltaNet, linear attention)
would carry one branch's tokens into the next, so preflight asks this of the host's config.json.
Pure: a dict in, an answer out. The payload's ddtree_config.py carries the same rules for the host.
"""

from __future__ import annotations

from typing import Any

HYBRID_MODEL_TYPES = frozenset({
    "qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h", "falcon_h1", "granitemoehybrid", "jamba",
    "bamba", "zamba", "zamba2", "mamba", "mamba2", "lfm2", "lfm2_moe", "kimi_linear", "jet_nemotron",
    "recurrent_gemma", "rwkv", "minimax_m1",
})
_RECURRENT_WORDS = ("linear", "mamba", "ssm", "conv", "recurrent", "deltanet", "rwkv", "gdn")
_RECURRENT_KEYS = ("full_attention_interval", "linear_conv_kernel_dim", "linear_attn_config")
_NESTED = ("text_config", "language_config", "llm_config", "thinker_config")


def hybrid_reason(config: object, _depth: int = 0) -> str | None:
    """Why `config` (a parsed config.json) is hybrid, or None when every layer is attention."""
    if not isinstance(config, dict):
        return None
    reason = _own_reason(config)
    if reason or _depth >= 2:
        return reason
    for key in _NESTED:
        nested = hybrid_reason(config.get(key), _depth + 1)
        if nested:
            return f"{key}: {nested}"
    return None


def _own_reason(config: dict[str, Any]) -> str | None:
    """hybrid_reason for this level only (not the nested text/language configs)."""
    model_type = config.get("model_type")
    if model_type in HYBRID_MODEL_TYPES:
        return f"model_type is {model_type!r}"
    for key in ("layer_types", "layers_block_type"):
        kinds = config.get(key)
        if isinstance(kinds, (list, tuple)):
            odd = sorted({str(k) for k in kinds if any(w in str(k).lower() for w in _RECURRENT_WORDS)})
            if odd:
                return f"{key} contains {odd[0]!r}"
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and "M" in pattern:
        return "hybrid_override_pattern has Mamba layers"
    for key in _RECURRENT_KEYS:
        if config.get(key) is not None:
            return f"it sets {key}"
    for key in config:
        if str(key).startswith(("mamba_", "ssm_")):
            return f"it sets {key}"
    return None


def is_hybrid_config(config: object) -> bool:
    return hybrid_reason(config) is not None

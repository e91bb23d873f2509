"""DDTree's launch flags, their validation and the hybrid-target guard, shared by every sglang version.

Shipped as ``sglang.srt.speculative.ddtree_config``. Imports nothing from sglang or torch, so the
launcher can validate before any worker starts. The hybrid rules mirror fleetspec.model.hybrid
(fleetspec's preflight); a unit test keeps the two in agreement.
"""

from __future__ import annotations

import argparse
import json
import os

ALGORITHM = "DDTREE"
DEFAULT_BUDGET = 64
FLAG_DESTS = ("speculative_ddtree_budget", "speculative_ddtree_topk_cap", "speculative_ddtree_shadow_linear")

HYBRID_MODEL_TYPES = frozenset({
    "qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h", "falcon_h1", "granitemoehybrid", "jamba",
    "bamba", "zamba", "zamba2", "mamba", "mamba2", "lfm2", "lfm2_moe", "kimi_linear", "jet_nemotron",
    "recurrent_gemma", "rwkv", "minimax_m1",
})
_RECURRENT_WORDS = ("linear", "mamba", "ssm", "conv", "recurrent", "deltanet", "rwkv", "gdn")
_RECURRENT_KEYS = ("full_attention_interval", "linear_conv_kernel_dim", "linear_attn_config")
_NESTED = ("text_config", "language_config", "llm_config", "thinker_config")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse turns the error into 'argument --x: ...', exit 2)."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def add_ddtree_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--speculative-ddtree-budget", type=positive_int, default=None,
        help=f"DDTREE only. Draft tree node budget per request (default {DEFAULT_BUDGET}).")
    parser.add_argument(
        "--speculative-ddtree-topk-cap", type=positive_int, default=None,
        help="DDTREE only. At most this many candidate tokens per tree depth (default: no cap).")
    parser.add_argument(
        "--speculative-ddtree-shadow-linear", action="store_true", default=False,
        help="DDTREE only. Build and log trees but verify the linear DFlash block "
             "(required on hybrid recurrent/linear-attention targets).")


def hybrid_reason(config, _depth: int = 0):
    """Why a parsed config.json is hybrid (recurrent or linear-attention layers), or None."""
    if not isinstance(config, dict):
        return None
    reason = _type_or_layers_reason(config) or _keys_reason(config)
    if reason or _depth >= 2:
        return reason
    for key in _NESTED:
        reason = hybrid_reason(config.get(key), _depth + 1)
        if reason:
            return f"{key}: {reason}"
    return None


def _type_or_layers_reason(config: dict):
    """A hybrid model_type, or recurrent kinds in its per-layer type list."""
    model_type = config.get("model_type")
    if model_type in HYBRID_MODEL_TYPES:
        return f"model_type is {model_type!r}"
    for key in ("layer_types", "layers_block_type"):
        kinds = config.get(key)
        if isinstance(kinds, (list, tuple)):
            odd = sorted({str(k) for k in kinds if any(w in str(k).lower() for w in _RECURRENT_WORDS)})
            if odd:
                return f"{key} contains {odd[0]!r}"
    return None


def _keys_reason(config: dict):
    """Mamba layers in a hybrid pattern, or a key only recurrent layers use."""
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


def read_model_config(model_path):
    """config.json of a local model folder, or None (a hub id is checked where it is downloaded)."""
    path = os.path.join(str(model_path or ""), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def check_ddtree_args(*, algorithm, budget, topk_cap, shadow_linear, model_path) -> dict:
    """Validate the DDTree flags; return them resolved. Raises ValueError with the reason."""
    algorithm = (algorithm or "").upper()
    if algorithm != ALGORITHM:
        if budget is not None or topk_cap is not None or shadow_linear:
            raise ValueError("--speculative-ddtree-* flags need --speculative-algorithm DDTREE, "
                             f"got {algorithm or 'none'}")
        return {}
    for name, value in (("budget", budget), ("topk-cap", topk_cap)):
        if value is not None and int(value) < 1:
            raise ValueError(f"--speculative-ddtree-{name} must be >= 1, got {value}")
    reason = hybrid_reason(read_model_config(model_path))
    if reason and not shadow_linear:
        raise ValueError(
            f"DDTREE refuses a hybrid target ({model_path}: {reason}): recurrent state would leak "
            "across tree branches. Pass --speculative-ddtree-shadow-linear to build and log trees "
            "while verifying linearly.")
    return {"budget": int(budget or DEFAULT_BUDGET), "topk_cap": topk_cap,
            "shadow_linear": bool(shadow_linear), "hybrid": reason}

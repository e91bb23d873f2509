"""A model's config.json and whether it is hybrid (linear-attention / recurrent layers).

Hybrid targets leak recurrent state across tree branches, so playbooks treat them differently.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

MISSING = "__FLEETSPEC_NO_CONFIG__"
_HYBRID_WORDS = ("linear_attention", "linear-attention", "mamba", "gated_delta", "deltanet", "recurrent", "ssm")


@dataclass
class ModelConfig:
    path: str
    found: bool
    config: dict[str, Any] = field(default_factory=dict)
    is_hybrid: bool = False

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])


def command(path: str) -> str:
    f = shlex.quote(path.rstrip("/") + "/config.json")
    return f"if [ -r {f} ]; then cat {f}; else echo {MISSING}; fi"


def _fallback_is_hybrid(config: dict[str, Any]) -> bool:
    for cfg in (config, config.get("text_config") or {}):
        if not isinstance(cfg, dict):
            continue
        for key in ("layer_types", "layers_block_type"):
            kinds = cfg.get(key) or []
            if any(isinstance(k, str) and any(w in k.lower() for w in _HYBRID_WORDS) for k in kinds):
                return True
        if cfg.get("hybrid_override_pattern") or cfg.get("attn_layer_indices") is not None:
            return True
        if any(k.startswith(("linear_num_", "mamba_")) for k in cfg):
            return True
    return False


def is_hybrid(config: dict[str, Any]) -> bool:
    try:
        from fleetspec.model.hybrid import is_hybrid_config
    except ImportError:
        return _fallback_is_hybrid(config)
    return bool(is_hybrid_config(config))


def parse(stdout: str, path: str = "") -> ModelConfig:
    if stdout.strip() == MISSING:
        return ModelConfig(path=path, found=False)
    config = json.loads(stdout)
    if not isinstance(config, dict):
        raise ValueError("config.json is not a JSON object")
    return ModelConfig(path=path, found=True, config=config, is_hybrid=is_hybrid(config))

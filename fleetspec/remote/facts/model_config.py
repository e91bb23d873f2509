"""A model's config.json and whether it is hybrid (linear-attention / recurrent layers).

Hybrid targets leak recurrent state across tree branches, so playbooks treat them differently;
the rule is fleetspec.model.hybrid's (the payload's, loaded once).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from fleetspec.model import hostjson
from fleetspec.model.hybrid import is_hybrid_config

MISSING = "__FLEETSPEC_NO_CONFIG__"


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


def parse(stdout: str, path: str = "") -> ModelConfig:
    if stdout.strip() == MISSING:
        return ModelConfig(path=path, found=False)
    config = hostjson.loads(stdout)
    if not isinstance(config, dict):
        raise ValueError("config.json is not a JSON object")
    return ModelConfig(path=path, found=True, config=config, is_hybrid=is_hybrid_config(config))

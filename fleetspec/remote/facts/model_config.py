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
from fleetspec.remote.limits import CONFIG_JSON_MAX, size

MISSING = "__FLEETSPEC_NO_CONFIG__"
NOT_REGULAR = "__FLEETSPEC_CONFIG_NOT_A_FILE__"


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
    """At most CONFIG_JSON_MAX + 1 bytes of a regular config.json (a link to /dev/zero or a FIFO
    is named, never read)."""
    f = shlex.quote(path.rstrip("/") + "/config.json")
    return (f"if [ -f {f} ] && [ -r {f} ]; then head -c {CONFIG_JSON_MAX + 1} -- {f}; "
            f"elif [ -e {f} ]; then echo {NOT_REGULAR}; else echo {MISSING}; fi")


def parse(stdout: str, path: str = "") -> ModelConfig:
    if stdout.strip() == MISSING:
        return ModelConfig(path=path, found=False)
    where = path.rstrip("/") + "/config.json"
    if stdout.strip() == NOT_REGULAR:
        raise ValueError(f"{where} is not a regular file (a device, FIFO or folder); refusing to read it")
    if len(stdout.encode()) > CONFIG_JSON_MAX:
        raise ValueError(f"{where} is larger than {size(CONFIG_JSON_MAX)}; fleetspec reads at most that")
    config = hostjson.loads(stdout)
    if not isinstance(config, dict):
        raise ValueError("config.json is not a JSON object")
    return ModelConfig(path=path, found=True, config=config, is_hybrid=is_hybrid_config(config))

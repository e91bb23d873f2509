"""Is a target model hybrid (recurrent or linear-attention layers beside attention)?

DDTree verifies many branches in one pass; recurrent state (Mamba, GatedDeltaNet, linear attention)
would carry one branch's tokens into the next, so preflight asks this of the host's config.json and
the payload's launcher asks it again on the host. The rule is written once, in the payload's
ddtree_config.py (which must stay free of fleetspec imports); this module loads that file.
Pure: a dict in, an answer out.
"""

from __future__ import annotations

from typing import Callable

from fleetspec.model import payload

_RULE = payload.load("ddtree_config")

HYBRID_MODEL_TYPES: frozenset[str] = _RULE.HYBRID_MODEL_TYPES
hybrid_reason: Callable[[object], str | None] = _RULE.hybrid_reason   # why a config.json is hybrid, or None


def is_hybrid_config(config: object) -> bool:
    return hybrid_reason(config) is not None

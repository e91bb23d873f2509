"""A playbook's options for one deploy: its defaults, the operator's --set, then the hybrid rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from fleetspec.errors import UserError
from fleetspec.model.playbook import Playbook


@dataclass(frozen=True)
class ResolvedOptions:
    values: Mapping[str, Any]
    notes: tuple[str, ...] = ()


def resolve_options(playbook: Playbook, overrides: Mapping[str, Any], hybrid: bool) -> ResolvedOptions:
    """Defaults < --set overrides, then the hybrid rule: `auto` becomes hybrid.auto on a hybrid
    target and hybrid.otherwise elsewhere; a value in hybrid.refuse on a hybrid target is refused
    here, before any host is touched."""
    values = dict(playbook.options)
    for name, value in overrides.items():
        if name not in values:
            raise UserError(f"--set {name}: {playbook.path.name} has no option {name!r}")
        values[name] = value
    notes: list[str] = []
    rule = playbook.hybrid
    if rule is not None:
        value = values[rule.option]
        known = dict.fromkeys(["auto", rule.auto, rule.otherwise, *rule.refuse])
        if value not in known:   # a typo (shadow_linear) must not slip past the hybrid guard
            raise UserError(f"--set {rule.option}={value}: expected one of {', '.join(known)} "
                            f"({playbook.path.name} hybrid rule)")
        if value == "auto":
            values[rule.option] = rule.auto if hybrid else rule.otherwise
            kind = "hybrid" if hybrid else "pure-attention"
            notes.append(f"{rule.option}=auto -> {values[rule.option]} ({kind} target)")
        elif hybrid and value in rule.refuse:
            raise UserError(
                f"{playbook.algo}: {rule.option}={value} is refused on a hybrid target (its linear-attention/"
                f"recurrent state would leak across branches); use {rule.option}={rule.auto} or auto")
    return ResolvedOptions(values=values, notes=tuple(notes))

"""The new ExecStart argv, derived from the recorded one (pure).

The operator's ExecStart is the truth about everything except speculative decoding: every other
argument is kept byte for byte; the speculative group (any `--speculative…` option, including
argparse's unique prefixes such as `--speculative-algo`, in `--opt v` and `--opt=v` forms) is
dropped, and the playbook's flags, rendered for the host, take its place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import jinja2

from fleetspec.errors import UserError
from fleetspec.model.playbook import Playbook

SPEC_PREFIX = "--speculative"
# Shortest unambiguous prefix of --speculative-algorithm in sglang (--speculative-a is shared
# with --speculative-accept-threshold-*).
_ALGO_MIN = "--speculative-al"
_ALGO_FULL = "--speculative-algorithm"
_NUMBER = re.compile(r"^-\d+(\.\d*)?([eE][-+]?\d+)?$|^-\.\d+$")


def is_option(token: str) -> bool:
    """An option token as argparse sees it: `-x`/`--xyz`, not a negative number, not a lone `-`."""
    return token.startswith("-") and token != "-" and token != "--" and not _NUMBER.match(token)


def option_name(token: str) -> str:
    return token.split("=", 1)[0]


def is_speculative(token: str) -> bool:
    return is_option(token) and option_name(token).startswith(SPEC_PREFIX)


def split_speculative(argv: Sequence[str]) -> tuple[list[str], list[str], int | None]:
    """(kept, dropped, index in kept where the dropped group started, or None when none was)."""
    kept: list[str] = []
    dropped: list[str] = []
    at: int | None = None
    i = 0
    while i < len(argv):
        token = argv[i]
        if i > 0 and is_speculative(token):
            if at is None:
                at = len(kept)
            dropped.append(token)
            i += 1
            if "=" not in token:
                while i < len(argv) and not is_option(argv[i]):
                    dropped.append(argv[i])
                    i += 1
            continue
        kept.append(token)
        i += 1
    return kept, dropped, at


def derive_argv(baseline: Sequence[str], flags: Sequence[str]) -> list[str]:
    """Baseline argv with its speculative group replaced by `flags` (at the same place, or at
    the end when the baseline had none)."""
    kept, _, at = split_speculative(baseline)
    at = len(kept) if at is None else at
    return [*kept[:at], *flags, *kept[at:]]


def speculative_algorithm_from_argv(argv: Sequence[str]) -> str | None:
    """The algorithm as the operator wrote it (`NEXTN` stays NEXTN; sglang resolves it to EAGLE).

    The last occurrence wins, as with argparse. None when the argv names no algorithm.
    """
    found = None
    for i, token in enumerate(argv):
        if not is_option(token):
            continue
        name = option_name(token)
        if len(name) >= len(_ALGO_MIN) and _ALGO_FULL.startswith(name):
            if "=" in token:
                found = token.split("=", 1)[1]
            elif i + 1 < len(argv) and not is_option(argv[i + 1]):
                found = argv[i + 1]
    return found


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


_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)


def render_flags(playbook: Playbook, host_vars: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
    """The playbook's launch flags as argv tokens for one host (jinja over `host` and `options`)."""
    context = {"host": dict(host_vars), "options": dict(options)}
    out: list[str] = []
    for i, flag in enumerate(playbook.launch.flags):
        where = f"{playbook.path}: launch.flags[{i}]"
        try:
            if flag.when is not None and not _ENV.compile_expression(flag.when)(**context):
                continue
            for token in flag.tokens:
                rendered = _ENV.from_string(token).render(**context) if ("{{" in token or "{%" in token) else token
                if rendered == "" or rendered == "None":
                    raise UserError(f"{where}: {token!r} rendered empty for this host (set the var in the inventory)")
                out.append(rendered)
        except jinja2.UndefinedError as err:
            raise UserError(f"{where}: {err.message} (set it in the inventory's vars or the playbook's options)") from None
        except jinja2.TemplateError as err:
            raise UserError(f"{where}: bad template: {err}") from None
    return out

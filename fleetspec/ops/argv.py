"""The new ExecStart argv, derived from the recorded one.

The operator's ExecStart is the truth about everything except speculative decoding: every other
argument is kept byte for byte; the speculative group (every option whose argparse dest starts
with speculative_ in the host version's real parser — fleetspec.model.launch) is dropped, the
playbook's carried options (draft runtime backends) stay, and the playbook's flags, rendered for
the host, take the group's place. `plan_launch` does that for a classified launch form;
`derive_argv`/`split_speculative` are the prefix-based fallback used only where no parser table
is at hand (reading an algorithm back in status).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from fleetspec.errors import UserError
from fleetspec.model import graphsize, launch
from fleetspec.model.playbook import Playbook
from fleetspec.remote import files
from fleetspec.remote.api import TransportLike

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


# Launch forms and the real parser's split -----------------------------------------------------
@dataclass(frozen=True)
class LaunchPlan:
    """What the deploy does to the command line and the environment, for the plan and the ledger."""

    form: launch.LaunchForm
    derived: launch.Derived
    env_kept: tuple[str, ...] = ()        # speculation-only variables of the baseline that stay
    env_dropped: tuple[str, ...] = ()     # … that the drop-in unsets (UnsetEnvironment=)
    simulated: tuple[str, ...] = ()       # SGLANG_SIMULATE_ACC_*: every gate is inconclusive
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = self.derived
        return {"form": self.form.label, "prefix": self.form.prefix, "path": self.form.path,
                "kept": d.kept, "dropped": d.dropped, "carried": d.carried, "added": d.added,
                "changed": d.changed,
                "baseline_algorithm": d.algorithm, "env_kept": list(self.env_kept),
                "env_dropped": list(self.env_dropped), "simulated_env": list(self.simulated)}


def classify_or_refuse(command, where: str) -> launch.LaunchForm:
    """The launch form of the baseline's ExecStart command (unitfile.ExecCommand), or a one-line
    refusal (exit 2) naming the host, the service and the form."""
    try:
        return launch.classify(list(command.argv), path=command.path, prefix=command.flags)
    except launch.LaunchRefused as err:
        raise UserError(f"{where}: {err}") from None


def option_table(t: TransportLike, python: str, version: str, host: str) -> launch.OptionTable:
    """The packaged table of this sglang version's parser; for a version fleetspec has no table of,
    the host's own parser is asked (one python start, ~10 s)."""
    table = launch.load_table(version)
    if table is not None:
        return table
    r = files.run_python_from_root(t, python, launch.DUMP_SCRIPT, timeout_s=300)
    try:
        table = launch.parse_dump(r.stdout)
    except ValueError as err:
        tail = (r.stderr.strip().splitlines() or [f"exit {r.rc}"])[-1]
        raise UserError(f"{host}: cannot read sglang {version}'s option parser with {python} ({err}: {tail})") from None
    return table


def plan_launch(form: launch.LaunchForm, table: launch.OptionTable, flags: Sequence[str], playbook: Playbook,
                version: str, environment: Mapping[str, str], where: str) -> LaunchPlan:
    """Split the baseline with the real parser's table, derive the new argv, and decide the
    speculation-only environment. Refusals name the host and service (exit 2)."""
    try:
        derived = launch.derive(form, table, flags, carry=playbook.launch.carry, drop=playbook.launch.drop,
                                version=version)
    except launch.LaunchRefused as err:
        raise UserError(f"{where}: {err}") from None
    sized = graphsize.size(derived, table, playbook.launch.cuda_graph, where)
    derived = sized.derived
    keep = set(playbook.launch.env_keep)
    head_env = [a.split("=", 1)[0] for a in form.env_assignments]
    bad_head = [n for n in launch.speculative_env(head_env) if n not in keep]
    if bad_head:
        raise UserError(f"{where}: ExecStart sets {bad_head[0]} through `env`, which fleetspec cannot unset; "
                        f"move it to an Environment= line (the playbook {playbook.path.name} drops it)")
    names = [*environment, *head_env]
    spec = launch.speculative_env(names)
    kept = tuple(n for n in spec if n in keep or n in playbook.launch.env)
    dropped = tuple(n for n in spec if n not in kept and n in environment)
    simulated = tuple(n for n in names if launch.SIMULATED.match(n))
    notes = [f"cuda graph: {sized.note}"] if sized.note else []
    if derived.dropped:
        notes.append("speculative options dropped: " + " ".join(" ".join(i) for i in derived.dropped))
    if derived.carried:
        notes.append("speculative options carried over: " + " ".join(" ".join(i) for i in derived.carried))
    if dropped:
        notes.append("speculation-only environment unset: " + ", ".join(dropped))
    if kept:
        notes.append("speculation-only environment kept: " + ", ".join(kept))
    if simulated:
        notes.append(f"{', '.join(simulated)} is set: acceptance is simulated, so every gate is inconclusive "
                     f"(fail closed)")
    return LaunchPlan(form=form, derived=derived, env_kept=kept, env_dropped=dropped, simulated=simulated,
                      notes=tuple(notes))


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


_ENV = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)


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

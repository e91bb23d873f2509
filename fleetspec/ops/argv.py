"""The new ExecStart argv, derived from the recorded one.

The operator's ExecStart is the truth about everything except speculative decoding: every other
argument is kept byte for byte; the speculative group (every option whose argparse dest starts
with speculative_ in the host version's real parser — fleetspec.model.launch) is dropped, the
playbook's carried options (draft runtime backends) stay, and the playbook's flags, rendered for
the host, take the group's place. `plan_launch` does that for a classified launch form;
`speculative_algorithm_from_argv` reads an algorithm back where no parser table is at hand (status).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from fleetspec.errors import UserError
from fleetspec.model import container_compose, gpuhealth, graphsize, launch
from fleetspec.model.container_compose import ComposeUp
from fleetspec.model.container_launch import ContainerRun
from fleetspec.model.playbook import Playbook
from fleetspec.ops.flags import Flags

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
    gpus: tuple[int, str] | None = None   # GPUs the launch uses on this host, and how (TP x DP); None: one
    max_running: int | None = None        # --max-running-requests: the host's serving concurrency (gates)

    def to_dict(self) -> dict:
        d = self.derived
        return {"form": self.form.label, "prefix": self.form.prefix, "path": self.form.path,
                "kept": d.kept, "dropped": d.dropped, "carried": d.carried, "added": d.added,
                "changed": d.changed,
                "baseline_algorithm": d.algorithm, "env_kept": list(self.env_kept),
                "env_dropped": list(self.env_dropped), "simulated_env": list(self.simulated)}


def classify_or_refuse(command, where: str) -> launch.LaunchForm | ContainerRun:
    """The launch form (or the `docker run`/`podman run` container form) of the baseline's ExecStart
    command (systemd_unit.ExecCommand), or a one-line refusal (exit 2) naming the host, the service and the form."""
    try:
        form = container_compose.classify_exec(list(command.argv), path=command.path, prefix=command.flags)
    except launch.LaunchRefused as err:
        raise UserError(f"{where}: {err}") from None
    if isinstance(form, ComposeUp):
        raise UserError(f"{where}: ExecStart runs `compose up` ({', '.join(form.files) or 'the default compose file'}): "
                        f"fleetspec reads compose services (docs/containers.md) but plans `docker run`/`podman run` "
                        f"units only")
    return form


def _sets(argv, flag: str) -> bool:
    return any(w == flag or w.startswith(flag + "=") for w in argv)


def plan_launch(form: launch.LaunchForm, table: launch.OptionTable, flags: Flags, playbook: Playbook,
                version: str, environment: Mapping[str, str], where: str, gpu_mem: float | None = None,
                env_where: str | None = None) -> LaunchPlan:
    """Split the baseline with the real parser's table, derive the new argv, and decide the
    speculation-only environment. Refusals name the host and service (exit 2). `gpu_mem`: the
    smallest GPU's memory in MiB (graph sizing), None without GPU facts. `env_where`: where the
    engine's environment is written when not in the unit (a container's `-e`), for the notes."""
    metrics = playbook.bake is not None and not _sets(form.args, "--enable-metrics") and not _sets(
        flags.argv, "--enable-metrics")
    try:
        derived = launch.derive(form, table, [*flags.argv, *(["--enable-metrics"] if metrics else [])],
                                carry=playbook.launch.carry, drop=playbook.launch.drop, version=version)
    except launch.LaunchRefused as err:
        raise UserError(f"{where}: {err}") from None
    sized = graphsize.size(derived, table, playbook.launch.cuda_graph, where, flags.values, gpu_mem=gpu_mem)
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
    if metrics:
        notes.append("--enable-metrics added: the playbook's bake reads the engine's own /metrics")
    if derived.dropped:
        notes.append("speculative options dropped: " + " ".join(" ".join(i) for i in derived.dropped))
    if derived.carried:
        notes.append("speculative options carried over: " + " ".join(" ".join(i) for i in derived.carried))
    if dropped:
        notes.append(f"speculation-only environment {'dropped from ' + env_where if env_where else 'unset'}: "
                     + ", ".join(dropped))
    if kept:
        notes.append("speculation-only environment kept: " + ", ".join(kept))
    if simulated:
        notes.append(f"{', '.join(simulated)} is set: acceptance is simulated, so every gate is inconclusive "
                     f"(fail closed)")
    named = graphsize.given(derived.kept, table)
    running = named.get("max_running_requests")
    return LaunchPlan(form=form, derived=derived, env_kept=kept, env_dropped=dropped, simulated=simulated,
                      notes=tuple(notes), gpus=gpuhealth.gpus_needed(named),
                      max_running=int(running) if running is not None and running.isdigit() and int(running) > 0
                      else None)



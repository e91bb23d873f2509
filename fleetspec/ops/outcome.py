"""What a deploy is asked to do and how it ended: the request, the step failure that ends a
deploy's steps, and the outcome (--json and the summary print it; the fleet and rollback read it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from fleetspec.errors import FleetspecError
from fleetspec.model.inventory import Host
from fleetspec.model.playbook import Playbook
from fleetspec.ops.planning import Plan


class StepFailed(FleetspecError):
    def __init__(self, step: str, reason: str, evidence: dict | None = None, command: str | None = None):
        self.step, self.reason, self.evidence = step, reason, evidence or {}
        self.command = command         # set: the host needs an operator (exit 3) before any deploy
        super().__init__(f"{step}: {reason}")


@dataclass
class DeployRequest:
    host: Host
    playbook: Playbook
    root: Path
    mode: str = "release"
    plan_only: bool = False
    options: dict = field(default_factory=dict)
    run_gates: bool = True
    prune: bool = True                 # bench deploys keep the operator's releases untouched
    pause_at: str | None = None        # test hook: stop (SIGSTOP-able) before this step
    release_id: str | None = None      # a release --prestage staged on the host: used if still as planned
    allow_unhealthy: bool = False      # deploy onto an engine that does not serve (gates off): the operator's choice
    seat: Any = None                   # ops.drain.Seat: the host's router, taken out around its restart
    rollout: str | None = None         # the rollout's id, written in each of this deploy's ledger lines


class Outcome(StrEnum):
    """How a deploy (or a rollback) ended; the values are what --json and the summary print."""
    HEALTHY = "healthy"
    ROLLED_BACK = "rolled_back"
    PLANNED = "planned"
    STAGED = "staged"                  # deploy --stage-only: staged and smoke-tested, nothing live changed
    REFUSED = "refused"
    NEEDS_ATTENTION = "needs_attention"
    FAILED = "failed"
    SKIPPED = "skipped"                # a rollout stopped before this host
    PENDING = "pending"                # a rollout paused before this host: `promote` starts it


@dataclass
class DeployOutcome:
    host: str
    status: Outcome
    release: str | None = None
    failed_step: str | None = None
    reason: str = ""
    evidence: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    plan: Plan | None = None
    seconds: float = 0.0
    engine_wait_s: float = 0.0
    exit_code: int = 0
    revert_wait_s: float = 0.0         # a failed deploy's revert: the previous state's restart and load
    step_seconds: dict = field(default_factory=dict)
    previous: str | None = None        # what the service ran before this deploy: a release id or "baseline"
    kernel: dict = field(default_factory=dict)   # DDTree candidate path the smoke tests saw, and any note
    router: dict = field(default_factory=dict)   # its router: name, worker, seconds out, the drain's wait

    def to_json(self) -> dict:
        return {k: (v.to_dict() if isinstance(v, Plan) else v) for k, v in self.__dict__.items()}

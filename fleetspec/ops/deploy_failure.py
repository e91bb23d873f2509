"""The deploy's failure path (a part of ops/deploy.py's Deploy): revert to the previous good
state and prove it, or say what is left when the host itself was lost."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fleetspec.errors import FleetspecError
from fleetspec.model import ledger as L
from fleetspec.model.release import BASELINE
from fleetspec.ops import activation, container_plan, gpu_checks, probes
from fleetspec.ops.outcome import DeployOutcome, Outcome, StepFailed
from fleetspec.remote.lock import LockLost


class FailurePath:
    if TYPE_CHECKING:     # the rest of Deploy's state (ops/deploy.py)
        def __getattr__(self, name: str) -> Any: ...

    # Failure path -----------------------------------------------------------------------------
    def _revert(self, failure: StepFailed) -> DeployOutcome:
        """Put the previous good state back, prove it healthy, and say what failed and why; a GPU
        fault that appeared since the restart is named, and leaves the host needing attention."""
        gpu = gpu_checks.cause_since(self.t, self.host, self.pf.gpu_health) if self.switched else []
        if gpu:
            failure = StepFailed(failure.step, f"{failure.reason}; on the GPUs since the restart: {'; '.join(gpu)}",
                                 failure.evidence, failure.command)
        self.echo(f"[{self.host.name}] {failure.step} failed: {failure.reason}")
        self.echo(f"[{self.host.name}] reverting to {self.previous or BASELINE}")
        self.state.defer(L.Entry.status(self.release_id, L.FAILED, step=failure.step, reason=failure.reason))
        began = time.monotonic()   # the FAILED line travels with "revert started", before any change
        try:
            self.state.record(L.Entry.step(self.release_id, "revert", L.StepState.STARTED,
                                           to=self.previous or BASELINE))
            if self.pf.baseline is None:          # the switch comes after the baseline step
                raise FleetspecError(f"{self.host.name}: no baseline to revert to")
            result = activation.revert_to(self.t, self.state, self.host, self.req.root, self.pf.baseline,
                                         self.previous, progress=self._progress, also=[self.release_id])
            self._progress(None)
            if result.ok and self.previous is None and self.pf.baseline.container:   # the baseline's image, unlabelled
                problem = container_plan.container_problem(self.pf.baseline,
                                                           container_plan.running_container(self.t, self.pf.baseline))
                if problem:
                    result = probes.ProbeResult(False, "revert", f"{problem} after the revert", result.waited_s)
        except FleetspecError as err:
            result = probes.ProbeResult(False, "revert", str(err))
        except Exception as err:  # whatever the revert met, it failed: say so, exit 3
            result = probes.ProbeResult(False, "revert", f"internal error: {type(err).__name__}: {err}")
        self.step_seconds["revert"] = round(time.monotonic() - began, 3)
        self.revert_wait = result.waited_s
        if not result.ok:
            self.state.record(L.Entry.step(self.release_id, "revert", L.StepState.FAILED, reason=result.reason))
            return self._outcome(Outcome.NEEDS_ATTENTION, failure=failure, exit_code=3,
                                 reason=f"{failure.step}: {failure.reason}; the revert failed too: {result.reason}",
                                 command=f"fleetspec rollback {self.host.name}  (or on the host: sh "
                                         f"{self.state.layout.release(self.release_id)}/rollback.sh)")
        self.state.defer(L.Entry.step(self.release_id, "revert", L.StepState.OK))
        self._mark(L.ROLLED_BACK, to=self.previous or BASELINE)
        if gpu:       # back on the previous state, but on the GPU that just failed: not fine
            return self._outcome(Outcome.NEEDS_ATTENTION, failure=failure, exit_code=3,
                                 reason=f"{failure.step}: {failure.reason}; reverted to {self.previous or BASELINE}, "
                                        f"which runs on the same GPUs",
                                 command=f"ssh {self.host.address} nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER")
        return self._outcome(Outcome.ROLLED_BACK, failure=failure, exit_code=1)

    def _lost(self, err: FleetspecError) -> DeployOutcome:
        """The host stopped answering (link cut, sshd gone) so nothing more can be done or recorded.
        After the switch it may run an unproven release: exit 3 with the command that finishes it."""
        where = err.charged_step or self.current_step
        if isinstance(err, LockLost):
            # Someone else may act on the host now: no revert, no ledger line, nothing more from us.
            self.echo(f"[{self.host.name}] {err}")
            failure = StepFailed(where, str(err))
            if self.switched:
                return self._outcome(Outcome.NEEDS_ATTENTION, failure=failure, exit_code=3,
                                     reason=f"{where}: {err}; the host may run {self.release_id} unproven",
                                     command=f"fleetspec status {self.host.name}  (then, once the lock is free: "
                                             f"fleetspec rollback {self.host.name})")
            return self._outcome(Outcome.FAILED, failure=failure, exit_code=1,
                                 reason=f"{where}: {err}; what the service runs was not changed")
        self.echo(f"[{self.host.name}] lost the host during {where}: {err}")
        failure = StepFailed(where, f"lost the host: {err}")
        if self.switched:
            return self._outcome(Outcome.NEEDS_ATTENTION, failure=failure, exit_code=3,
                                 reason=f"{where}: lost the host after the switch to {self.release_id}; it may run "
                                        f"that release unproven: {err}",
                                 command=f"fleetspec rollback {self.host.name}  (once it answers; or on the host: "
                                         f"sh {self.state.layout.release(self.release_id)}/rollback.sh)")
        return self._outcome(Outcome.FAILED, failure=failure, exit_code=1,
                             reason=f"{where}: lost the host before the switch; what it runs was not changed: {err}",
                             command=f"fleetspec status {self.host.name}  (once it answers)")

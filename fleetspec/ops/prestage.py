"""`deploy --prestage`: stage a release on the hosts of later batches while the first batch (the
canary) deploys, so that their own deploy later finds it there and its stage step sends nothing.
The prestage starts the release's smoke runner too, as a deploy's stage does: the host's deploy
keeps that runner when it passed or still runs on the same input (remote/stage_host.py `kept`),
so the later batches' smoke steps overlap the canary's instead of each adding their own.

Staging changes nothing that runs (objects, a release folder built aside and renamed in), but it
writes under the host's state root, where another controller's deploy may prune or abandon: so a
prestage takes the host's deploy lock for the seconds it stages and records the release in the
ledger (`stage` started/ok, status `staged`). A release prestaged for a rollout that then stops
stays staged and unswitched: the host's next deploy marks it failed ("interrupted before switch")
and pruning removes it like any failed release.

`deploy --stage-only` (`stage_ahead`) is the same staging, for every target, with the smoke
verdict read under the same lock: the release is staged and proved importable hours before a
maintenance window, and nothing live changes. A passing one stays "staged" (`ahead`, its algo);
the host's next deploy of that algo takes it as it is (its preflight names it), so the window
holds only the switch: nothing sent, no build, the verdict kept (unless the install changed since,
remote/stage_host.py `fresh`). A failing one is marked failed, and its deploy is never attempted.
"""

from __future__ import annotations

import time
from typing import Callable

from fleetspec.errors import FleetspecError
from fleetspec.model import ledger as L
from fleetspec.model.layout import local_mirror
from fleetspec.model.release import new_release_id
from fleetspec.ops import preflight as preflight_mod
from fleetspec.ops import smoke_run, staging
from fleetspec.ops.deploy import DeployRequest
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.outcome import StepFailed
from fleetspec.remote.api import TransportLike
from fleetspec.remote.lock import RemoteLock


def prestage(t: TransportLike, req: DeployRequest, echo: Callable[[str], None] = print) -> str:
    """Preflight (read-only) and stage one host under its lock; returns the release id staged.
    Raises what preflight or staging raised: the host's own deploy then stages as usual."""
    return _stage_locked(t, req, echo, ahead=False)


def stage_ahead(t: TransportLike, req: DeployRequest, echo: Callable[[str], None] = print) -> str:
    """`deploy --stage-only` on one host: stage, then wait for the smoke verdict under the lock;
    returns the release id. A failing verdict marks the release failed and raises StepFailed."""
    return _stage_locked(t, req, echo, ahead=True)


def _stage_locked(t: TransportLike, req: DeployRequest, echo: Callable[[str], None], *, ahead: bool) -> str:
    pf = preflight_mod.run(t, req, echo if ahead else lambda line: None, wait_serving=False)   # a prestage's canary says it all
    host, service = req.host, req.host.vars.service
    state = HostState(t, host.name, service, mirror=local_mirror(req.root, host, service), rollout=req.rollout)
    state.redact = pf.redact
    rid = new_release_id(req.playbook.algo)
    mark = {"ahead": True, "algo": req.playbook.algo} if ahead else {"prestage": True}
    with RemoteLock(t, str(state.layout.lock), release=rid, note=echo) as lock:
        state.lock = lock
        began = time.monotonic()
        state.record(L.Entry.step(rid, "stage", L.StepState.STARTED, **mark))
        try:
            run, then = smoke_run.prepare(pf, state, rid)
            staged = staging.stage(t, pf, state, rid, state.current(), mode=req.mode, then=then)
        except FleetspecError as err:
            state.defer(L.Entry.step(rid, "stage", L.StepState.FAILED, reason=str(err)))
            state.record(L.Entry.status(rid, L.FAILED, step="stage",
                                        reason=f"{'staging ahead' if ahead else 'prestage'} failed; host unchanged"))
            raise
        state.defer(L.Entry.step(rid, "stage", L.StepState.OK, seconds=round(time.monotonic() - began, 3),
                                 **mark, files=len(staged.release.files), sent_bytes=staged.sent or 0,
                                 smoke_started=then is not None and staged.smoke_error is None,
                                 **({"smoke_reused": staged.smoke_reused} if staged.smoke_reused else {})))
        if ahead:
            _smoke_verdict(t, state, rid, run, staged, echo)
        state.record(L.Entry.status(rid, L.STAGED, **mark))   # status says "prestaged", not "died"
        if ahead:   # one staged release per algo: the older ones would never be switched to, nor pruned
            state.supersede_staged((*pf.staged_ahead_older, *filter(None, [pf.staged_ahead])), rid)
    if staged.smoke_error and not ahead:
        echo(f"[{host.name}] note: the prestage's smoke runner did not start, its deploy runs one: {staged.smoke_error}")
    echo(f"[{host.name}] {'staged' if ahead else 'prestaged'} {rid} ({staged.sent or 0} bytes sent)")
    return rid


def _smoke_verdict(t: TransportLike, state: HostState, rid: str, run: smoke_run.SmokeRun, staged: staging.Staged,
                   echo: Callable[[str], None]) -> None:
    """The staged release's smoke verdict, recorded as its smoke step; a failing one fails the
    release (nothing live changed) and ends the runner if it still runs."""
    began = time.monotonic()
    state.defer(L.Entry.step(rid, "smoke", L.StepState.STARTED))
    try:
        if staged.smoke_error:
            raise FleetspecError(f"the smoke tests did not start: {staged.smoke_error}")
        detail = smoke_run.finish(t, run)
    except FleetspecError as err:
        if run.scripts:
            smoke_run.stop(t, state, rid)
        state.defer(L.Entry.step(rid, "smoke", L.StepState.FAILED, reason=str(err)))
        state.record(L.Entry.status(rid, L.FAILED, step="smoke", reason="smoke tests failed while staging ahead; "
                                                                       "host unchanged"))
        raise StepFailed("smoke", str(err), evidence={"release": rid}) from None
    state.defer(L.Entry.step(rid, "smoke", L.StepState.OK, seconds=round(time.monotonic() - began, 3), **detail))
    smoke_run.tell(detail, state.host, echo)
    if staged.smoke_reused:
        echo(f"[{state.host}] smoke: the verdict of {staged.smoke_reused['release']} is replayed")

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
from fleetspec.remote.api import TransportLike
from fleetspec.remote.lock import RemoteLock


def prestage(t: TransportLike, req: DeployRequest, echo: Callable[[str], None] = print) -> str:
    """Preflight (read-only) and stage one host under its lock; returns the release id staged.
    Raises what preflight or staging raised: the host's own deploy then stages as usual."""
    pf = preflight_mod.run(t, req, lambda line: None)
    host, service = req.host, req.host.vars.service
    state = HostState(t, host.name, service, mirror=local_mirror(req.root, host.name, service))
    state.redact = pf.redact
    rid = new_release_id(req.playbook.algo)
    with RemoteLock(t, str(state.layout.lock), release=rid, note=echo) as lock:
        state.lock = lock
        began = time.monotonic()
        state.record(L.Entry.step(rid, "stage", L.StepState.STARTED, prestage=True))
        try:
            _, then = smoke_run.prepare(pf, state, rid)
            staged = staging.stage(t, pf, state, rid, state.current(), mode=req.mode, then=then)
        except FleetspecError as err:
            state.defer(L.Entry.step(rid, "stage", L.StepState.FAILED, reason=str(err)))
            state.record(L.Entry.status(rid, L.FAILED, step="stage", reason="prestage failed; host unchanged"))
            raise
        state.defer(L.Entry.step(rid, "stage", L.StepState.OK, seconds=round(time.monotonic() - began, 3),
                                 prestage=True, files=len(staged.release.files), sent_bytes=staged.sent or 0,
                                 smoke_started=then is not None and staged.smoke_error is None))
        state.record(L.Entry.status(rid, L.STAGED, prestage=True))   # status says "prestaged", not "died"
    if staged.smoke_error:
        echo(f"[{host.name}] note: the prestage's smoke runner did not start, its deploy runs one: {staged.smoke_error}")
    echo(f"[{host.name}] prestaged {rid} ({staged.sent or 0} bytes sent)")
    return rid

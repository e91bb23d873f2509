"""`fleetspec rollback HOST [--to RELEASE|baseline]`: back to a recorded good state, fast.

No gates by default: a rollback is what you run while a bad release serves traffic. The target is
the baseline (the service as first found) unless --to names a release that was proven healthy;
failed releases are never targets. Going to the baseline restores the recorded unit bytes and
drop-ins exactly, then proves the service healthy with the algorithm it served before.
An interrupted deploy (fleetspec killed, link cut) is finished here: its release is marked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from fleetspec.errors import NeedsAttention, UserError
from fleetspec.model import ledger as L
from fleetspec.model.baseline import Baseline, sha256
from fleetspec.model.layout import local_mirror
from fleetspec.model.release import BASELINE

PREVIOUS = "previous"      # rollback --to previous: what the current release replaced
from fleetspec.ops import activation, container_plan
from fleetspec.ops.deploy import Outcome
from fleetspec.ops.hoststate import HostState, legacy_dropin_paths
from fleetspec.remote import files, systemd
from fleetspec.remote.api import TransportLike
from fleetspec.remote.lock import RemoteLock


@dataclass
class RollbackOutcome:
    host: str
    status: Outcome                   # rolled_back | needs_attention
    target: str
    left: str | None                  # the release the service was on
    finished_interrupted: list[str] = field(default_factory=list)
    seconds: float = 0.0
    engine_wait_s: float = 0.0
    note: str = ""
    exit_code: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def rollback(t: TransportLike, host, root: Path, to: str | None = None, *, echo=print, progress=lambda _: None,
             seat=None, rollout: str | None = None) -> RollbackOutcome:
    """`seat` (ops.drain.Seat): the host's router; a removal a cut-off command left goes back
    first, and the worker is out of the router while its engine restarts (unless that would
    leave fewer than min_serving workers: a rollback is not refused for that). `to` may be
    PREVIOUS (previous_of); `rollout`: the rollout id its ledger lines carry."""
    started = time.monotonic()
    state = HostState(t, host.name, host.vars.service, local_mirror(root, host, host.vars.service), rollout=rollout)
    target = to or BASELINE
    # the ledger, baseline.json and `current` as the lock's holder read them: no command of their own
    with RemoteLock(t, str(state.layout.lock), release=f"rollback-to-{target}", note=echo, **state.lock_reads) as lock:
        state.lock = lock                       # each ledger line checks the lock is still ours
        baseline = state.baseline_from_text(lock.read_texts[state.baseline_json], repair=True)
        if state.repaired:
            echo(state.repaired)
        if baseline is None:
            raise UserError(f"{host.name}: no baseline recorded for {host.vars.service}: fleetspec never changed it")
        ledger = L.parse(lock.read_text or "")
        statuses = ledger.releases()
        if target == PREVIOUS:
            target = previous_of(ledger, state.current(lock.link_target), host.name)
        if target != BASELINE and statuses.get(target) != L.HEALTHY:
            healthy = [r for r, s in statuses.items() if s == L.HEALTHY]
            raise UserError(f"{host.name}: {target} is {statuses.get(target, 'unknown')}, not a healthy release; "
                            f"targets: baseline{', ' if healthy else ''}{', '.join(healthy)}")
        left = state.current(lock.link_target)
        # a release staged ahead changed nothing that runs and waits for its deploy: not a deploy to finish
        ahead = set(ledger.staged_ahead())
        interrupted = [rid for rid in ledger.interrupted() if rid not in ahead]
        record_under = left or (interrupted[-1] if interrupted else BASELINE)
        echo(f"[{host.name}] rollback {left or BASELINE} -> {target}")
        for rid in interrupted:
            last = ledger.last_step(rid)
            echo(f"[{host.name}] finishing interrupted deploy {rid} (it stopped at step "
                 f"{last.name if last else '?'}, {statuses.get(rid)})")
        state.record(L.Entry.step(record_under, "rollback", L.StepState.STARTED, to=target, interrupted=interrupted))
        router = _router(t, host, seat, state, lock, echo)
        switch_started = time.monotonic()
        switched = [rid for rid in interrupted if statuses.get(rid) == L.SWITCHED]
        result = _routed(router, lambda: activation.revert_to(
            t, state, host, root, baseline, None if target == BASELINE else target, also=switched,
            progress=lambda line: progress(f"[{host.name}] {line}" if line else None)))
        progress(None)
        if not result.ok:
            state.record(L.Entry.step(record_under, "rollback", L.StepState.FAILED, reason=result.reason))
            journal = systemd.journal_tail(t, host.vars.service, 10)
            raise NeedsAttention(f"{host.name}: rolled back to {target} but it is not healthy: {result.reason}; "
                                 f"journal: {' | '.join(journal[-3:])}",
                                 systemd.on_host_command(host.address, systemd.journal_command(host.vars.service)))
        if target == BASELINE:
            verify_baseline(t, state, baseline, host.name)
        for rid in interrupted:
            state.record(L.Entry.status(rid, L.ROLLED_BACK, to=target, reason="finished by rollback"))
        if left and left != record_under and left not in interrupted and statuses.get(left) == L.HEALTHY:
            state.record(L.Entry.step(left, "rollback", L.StepState.OK, to=target))
        state.record(L.Entry.step(record_under, "rollback", L.StepState.OK, to=target,
                                  waited_s=round(result.waited_s, 2)))
    return RollbackOutcome(host.name, Outcome.ROLLED_BACK, target, left, interrupted,
                           round(time.monotonic() - started, 2), round(result.waited_s, 2),
                           engine_wait_s_note(switch_started, result))


def previous_of(ledger: L.ParsedLedger, current: str | None, host_name: str) -> str:
    """What `current` replaced, as its `switched` line says: the baseline or a release that is
    still kept and healthy. UserError when the host is on its baseline (nothing came before) or
    when that release is no longer a target (failed, pruned), naming the targets there are."""
    if current is None:
        raise UserError(f"{host_name}: it runs its baseline: there is no release before it (--to previous)")
    before = None
    for e in ledger.entries:
        if e.kind == "status" and e.release == current and e.state == L.SWITCHED:
            before = e.detail.get("previous")
    if not isinstance(before, str) or not before:
        raise UserError(f"{host_name}: the ledger does not say what {current} replaced; name the target with "
                        f"--to RELEASE or --to baseline")
    statuses = ledger.releases()
    if before != BASELINE and statuses.get(before) != L.HEALTHY:
        healthy = [r for r, s in statuses.items() if s == L.HEALTHY and r != current]
        raise UserError(f"{host_name}: {current} replaced {before}, which is {statuses.get(before, 'unknown')} now; "
                        f"targets: baseline{', ' if healthy else ''}{', '.join(healthy)}")
    return before


def _routed(router, revert):
    """The revert while the worker is out of its router: back in once healthy, and back in
    (listed, whatever its health) when anything went wrong."""
    try:
        result = revert()
        if result.ok and router is not None:
            router.put_back(healthy=True)
        return result
    finally:
        if router is not None:
            router.ensure_back()


def _router(t, host, seat, state: HostState, lock, echo):
    """The host's HostDrain with its worker out (None without a router)."""
    if seat is None:
        return None
    from fleetspec.ops import drain

    router = drain.HostDrain(seat, state.record, drain.engine_in_flight(t, host), echo, host.name)
    try:
        router.restore_pending(lock.read_text or "")
    except Exception as err:  # a rollback goes on: it is what runs while a release misbehaves
        echo(f"[{host.name}] router {seat.spec.name}: {err}; the restart goes on without the router")
        return None
    try:
        router.take_out()           # min_serving is checked there, right before the removal
    except UserError as err:
        echo(f"[{host.name}] stays in the router while it restarts: {err}")
    except Exception as err:  # the restart goes on; _routed puts a worker that left back
        echo(f"[{host.name}] could not take it out of router {seat.spec.name}, the restart goes on: {err}")
    return router


def engine_wait_s_note(switch_started: float, result) -> str:
    overhead = time.monotonic() - switch_started - result.waited_s
    return f"fleetspec overhead {overhead:.2f}s beyond the engine's {result.waited_s:.2f}s restart and load"


def verify_baseline(t: TransportLike, state: HostState, baseline: Baseline, host: str) -> None:
    """Prove byte-exactness after the fact: unit file and admin drop-ins hash as recorded, and
    fleetspec's drop-in is gone."""
    wanted = {baseline.unit_path: baseline.unit_sha256,
              **{p: sha256(b) for p, b in [*baseline.sources.items(), *baseline.dropins.items()]}}
    ours = [state.dropin, *legacy_dropin_paths(state.service)]
    got = files.sha256_map(t, [*wanted, *ours])
    for path, digest in wanted.items():
        if got.get(path) != digest:
            raise NeedsAttention(f"{host}: {path} does not match the baseline after rollback",
                                 f"fleetspec rollback {host}")
    for path in ours:
        if path in got:
            raise NeedsAttention(f"{host}: {path} is still present after rollback", f"fleetspec rollback {host}")
    if baseline.container:
        problem = container_plan.container_problem(baseline, container_plan.running_container(t, baseline))
        if problem:
            raise NeedsAttention(f"{host}: {problem} after rollback", f"fleetspec rollback {host}")

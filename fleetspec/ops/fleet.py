"""Moving a fleet: canary hosts first, then batches, stopping once failures pass the limit.

Hosts are independent: each runs its own deploy (and its own revert) on its own connection, so a
slow or unreachable host costs only its own timeout. Ctrl-C stops starting hosts; hosts already
running finish or revert, so none is left mid-switch.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fleetspec.errors import FleetspecError, NeedsAttention, UserError
from fleetspec.ops.deploy import Deploy, DeployOutcome, DeployRequest, deploy
from fleetspec.ops.outcome import Outcome, StepFailed

Connect = Callable[[Any], Any]   # host -> its transport (the command's pool keeps one per host)


def _count(spec: str, total: int, what: str) -> int:
    spec = str(spec).strip()
    try:
        if spec.endswith("%"):
            return max(0, math.floor(total * float(spec[:-1]) / 100))
        return int(spec)
    except ValueError:
        raise UserError(f"--{what} {spec!r}: expected a count like 2 or a share like 25%") from None


@dataclass(frozen=True)
class Strategy:
    canary: int = 0
    serial: int = 1
    max_fail: int = 0
    parallel: int = 0
    rollback_all_on_abort: bool = False
    prestage: bool = False          # stage the later batches' hosts while the first batch deploys

    @classmethod
    def parse(cls, total: int, *, canary: int, serial: str, max_fail: str, parallel: int,
              rollback_all_on_abort: bool, prestage: bool = False) -> "Strategy":
        s = cls(canary=canary, serial=max(1, _count(serial, total, "serial")) if total else 1,
                max_fail=_count(max_fail, total, "max-fail"), parallel=parallel,
                rollback_all_on_abort=rollback_all_on_abort, prestage=prestage)
        if canary < 0 or parallel < 0:
            raise UserError("--canary and --parallel must not be negative")
        return s

    def batches(self, hosts: list) -> list[list]:
        out, rest = [], list(hosts)
        if self.canary:
            out.append(rest[: self.canary])
            rest = rest[self.canary:]
        while rest:
            out.append(rest[: self.serial])
            rest = rest[self.serial:]
        return out


def deploy_one(host, playbook, *, connect: Connect, root: Path, options, plan_only, run_gates, echo, progress,
               pause_at=None, mode="release", prestaged=None, allow_unhealthy=False, seat=None,
               rollout=None) -> DeployOutcome:
    """One host, start to end; every error becomes an outcome so the fleet goes on. `prestaged`:
    the host's prestage (a future of the release id staged there), waited for first."""
    started: list[Deploy] = []
    try:
        release_id = _prestaged_id(host, prestaged, echo)
        req = DeployRequest(host=host, playbook=playbook, root=root, plan_only=plan_only, mode=mode,
                            options=options, run_gates=run_gates, pause_at=pause_at, release_id=release_id,
                            allow_unhealthy=allow_unhealthy, seat=seat, rollout=rollout)
        return deploy(connect(host), req, echo=echo, progress=progress, on_start=started.append)
    except FleetspecError as err:
        return _error_outcome(host, err, echo)
    except Exception as err:  # one host's surprise must not end the fleet (nor its abort policy)
        return _internal_outcome(host, err, echo, switched=bool(started) and started[0].switched)


def _internal_outcome(host, err: Exception, echo, switched: bool) -> DeployOutcome:
    """An error no step turned into a failure: before the switch nothing runs changed (exit 1);
    after it, or where unknown, the host needs an operator (exit 3)."""
    reason = f"internal error: {type(err).__name__}: {str(err)[:300]}"
    status, code = (Outcome.NEEDS_ATTENTION, 3) if switched else (Outcome.FAILED, 1)
    echo(f"[{host.name}] {status}: {reason}")
    out = DeployOutcome(host.name, status, reason=reason, exit_code=code)
    if switched:
        out.evidence["command"] = f"fleetspec status {host.name}  (then: fleetspec rollback {host.name})"
    return out


def _error_outcome(host, err: FleetspecError, echo) -> DeployOutcome:
    """A host's error as its outcome (refused: bad input, exit 2; needs_attention: exit 3; else failed)."""
    status = (Outcome.REFUSED if isinstance(err, UserError) else Outcome.NEEDS_ATTENTION if err.exit_code == 3
              else Outcome.FAILED)
    if status != "refused":
        echo(f"[{host.name}] {status}: {err}")
    out = DeployOutcome(host.name, status, reason=str(err), exit_code=err.exit_code)
    if isinstance(err, StepFailed):
        out.failed_step = err.step
    if err.command:
        out.evidence["command"] = err.command
    return out


def stage_fleet(hosts, playbook, *, connect: Connect, root: Path, options, parallel: int = 0, mode="release",
                echo=print) -> list[DeployOutcome]:
    """`deploy --stage-only`: stage each host and read its smoke verdict, `parallel` at a time
    (default all); nothing that runs changes. A host's next deploy of this algo takes its release."""
    from fleetspec.ops.prestage import stage_ahead

    def one(host) -> DeployOutcome:
        began = time.monotonic()
        try:
            rid = stage_ahead(connect(host), DeployRequest(host=host, playbook=playbook, root=root, mode=mode,
                                                           options=options), echo)
        except FleetspecError as err:
            out = _error_outcome(host, err, echo)
            out.release = getattr(err, "evidence", {}).get("release")
            if out.status == "failed":
                out.reason += "; nothing live changed"
        else:
            out = DeployOutcome(host.name, Outcome.STAGED, release=rid)
        out.seconds = time.monotonic() - began
        return out

    with ThreadPoolExecutor(max_workers=min(len(hosts), parallel or len(hosts)) or 1, thread_name_prefix="stage") as pool:
        return list(pool.map(one, hosts))


def _prestaged_id(host, prestaged, echo) -> str | None:
    if prestaged is None:
        return None
    try:
        return prestaged.result()
    except Exception as err:          # the deploy stages as usual (and its preflight says what is wrong)
        echo(f"[{host.name}] prestage failed, staging in the deploy: {err}")
        return None


def _start_prestage(batches, playbook, *, connect: Connect, root: Path, options, strategy: Strategy, mode, echo,
                    rollout=None):
    """Stage every host after the first batch, `--parallel` at a time, while that batch deploys;
    returns the pool and {host name: future of the release id}."""
    from fleetspec.ops.prestage import prestage

    later = [h for batch in batches[1:] for h in batch]
    if not (strategy.prestage and later):
        return None, {}
    pool = ThreadPoolExecutor(max_workers=min(len(later), strategy.parallel or len(later)), thread_name_prefix="prestage")
    futures = {h.name: pool.submit(prestage, connect(h), DeployRequest(host=h, playbook=playbook, root=root,
                                                                       mode=mode, options=options, rollout=rollout),
                                   echo)
               for h in later}
    return pool, futures


def deploy_fleet(hosts, playbook, *, connect: Connect, root: Path, options, strategy: Strategy, plan_only=False,
                 run_gates=True, echo=print, progress=lambda _: None, pause_at=None,
                 mode="release", allow_unhealthy=False, seats=None, rollout=None) -> list[DeployOutcome]:
    """`connect(host)` gives the host's transport (one per host, reused); `root` is the fleet root;
    `seats`: {host name: ops.drain.Seat} for the hosts behind a router (each batch is checked
    against min_serving before anything changes). `rollout` (ops.rollouts.Control): the rollout's
    record: its batches from the first not run yet, its failures so far, written after each
    batch, and where it pauses (the hosts after a pause are `pending`, exit 0)."""
    outcomes: dict[str, DeployOutcome] = {}
    stop = threading.Event()
    rollout = rollout if rollout is not None else _NoRollout(strategy)
    batches = rollout.batches_of(hosts)
    first, failures = rollout.start, rollout.failures
    last = next((n for n in range(first, len(batches)) if rollout.pauses_after(n, len(batches))), len(batches) - 1)
    hosts = [h for batch in batches[first:] for h in batch]
    seats = _check_routers(batches[first:], strategy, seats or {}, plan_only)
    pre_pool, prestaged = (None, {}) if plan_only else _start_prestage(
        batches[first:last + 1], playbook, connect=connect, root=root, options=options, strategy=strategy, mode=mode,
        echo=echo, rollout=rollout.id)
    for number, batch in enumerate(batches[first:last + 1], first):
        if stop.is_set():
            break
        rollout.batch_started(number)
        width = min(len(batch), strategy.parallel or len(batch))
        pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="deploy")
        futures = {h.name: pool.submit(deploy_one, h, playbook, connect=connect, root=root, options=options,
                                       plan_only=plan_only, run_gates=run_gates, echo=echo, progress=progress,
                                       pause_at=pause_at, mode=mode, prestaged=prestaged.get(h.name),
                                       allow_unhealthy=allow_unhealthy, seat=seats.get(h.name),
                                       rollout=rollout.id)
                   for h in batch}
        try:
            for name, fut in futures.items():
                outcomes[name] = fut.result()
        except KeyboardInterrupt:
            echo("interrupted: no new hosts will start; waiting for running hosts to finish or revert")
            stop.set()
            for name, fut in futures.items():
                outcomes[name] = fut.result()
        finally:
            pool.shutdown(wait=True)
        failures += sum(1 for h in batch if outcomes[h.name].status not in ("healthy", "planned"))
        rollout.batch_done(number, [outcomes[h.name] for h in batch], failures)
        if failures > strategy.max_fail:
            label = "canary" if (number == 0 and strategy.canary) else f"batch {number + 1}"
            if len(outcomes) < len(hosts):      # said only when it stops hosts from starting
                echo(f"stopping: {failures} failed host(s) after {label} (--max-fail {strategy.max_fail})")
            stop.set()
    if pre_pool is not None:
        pre_pool.shutdown(wait=True)        # a prestage always ends: it holds a host's lock
    _not_run(hosts, outcomes, prestaged, paused_for=None if stop.is_set() else rollout.id)
    if stop.is_set() and strategy.rollback_all_on_abort and not plan_only:
        _rollback_moved(connect, root, hosts, outcomes, echo, progress, seats, rollout=rollout.id)
    return [outcomes[h.name] for h in hosts]


def _not_run(hosts, outcomes: dict, prestaged: dict, paused_for: str | None) -> None:
    """The hosts no batch started: pending after a pause (the next promote starts them), else
    skipped (the rollout stopped), with any release a prestage left on them."""
    for h in hosts:
        if h.name in outcomes:
            continue
        if paused_for is not None:
            outcomes[h.name] = DeployOutcome(h.name, Outcome.PENDING,
                                             reason=f"after the pause: fleetspec promote {paused_for}")
            continue
        out = outcomes[h.name] = DeployOutcome(h.name, Outcome.SKIPPED, reason="not started: the rollout stopped",
                                               exit_code=1)
        left = _left_staged(prestaged.get(h.name))
        if left:
            out.release = left
            out.reason += f"; {left} stays staged, unswitched: the next deploy marks it failed, prune removes it"


class _NoRollout:
    """A deploy with no record (bench, tests): the strategy's batches, all of them, no pause."""
    id = None
    start = failures = 0

    def __init__(self, strategy: Strategy):
        self.strategy = strategy

    def batches_of(self, hosts) -> list[list]:
        return self.strategy.batches(hosts)

    def pauses_after(self, number: int, total: int) -> bool:
        return False

    def batch_started(self, number: int) -> None:
        pass

    def batch_done(self, number: int, outcomes, failures: int) -> None:
        pass


def _check_routers(batches, strategy: Strategy, seats: dict, plan_only: bool) -> dict:
    """min_serving, for every batch and the worst hosts of it that can be out at once, before
    anything changes (a refusal is one line, exit 2); each drain checks again."""
    if seats and not plan_only:
        from fleetspec.ops.drain import check_batches

        check_batches(batches, seats, parallel=strategy.parallel)
    return seats


def _left_staged(future) -> str | None:
    if future is None or future.exception() is not None:
        return None
    return future.result()


def _rollback_moved(connect: Connect, root: Path, hosts, outcomes, echo, progress, seats=None, rollout=None) -> None:
    """Each host this run moved goes back to where this run found it (the release it was on, or
    its baseline), not to its baseline: an aborted rollout undoes only itself."""
    from fleetspec.model.release import BASELINE
    from fleetspec.ops.rollback import rollback

    for h in hosts:
        o = outcomes[h.name]
        if o.status != "healthy":
            continue
        back = None if o.previous in (None, BASELINE) else o.previous
        try:
            rollback(connect(h), h, root, back, echo=echo, progress=progress, seat=(seats or {}).get(h.name),
                     rollout=rollout)
            o.status, o.exit_code = "rolled_back", 1
            o.reason = f"rolled back to {back or BASELINE}: the rollout was aborted"
        except FleetspecError as err:
            o.status, o.reason, o.exit_code = "needs_attention", f"abort rollback failed: {err}", 3
        except Exception as err:  # one host's surprise must not stop the others' rollback
            o.status, o.exit_code = "needs_attention", 3
            o.reason = f"abort rollback failed: internal error: {type(err).__name__}: {str(err)[:300]}"


def rollback_fleet(hosts, to: str | None, *, connect: Connect, root: Path, echo=print, progress=lambda _: None,
                   on_error: Callable[[FleetspecError], None] = lambda err: None,
                   seats=None, strategy: Strategy | None = None, rollout=None) -> tuple[list[dict], int]:
    """`fleetspec rollback`: hosts back to `to` (None or "baseline": its baseline; "previous":
    what each one's current release replaced), in batches of `strategy.serial`, `parallel` at a
    time within one. Without a strategy: one host at a time, every host (a host that cannot be
    rolled back is a row of its own). With one, a batch that takes the failures past `max_fail`
    is the last; the hosts after it are `skipped` rows. Returns the rows (in `hosts` order) and
    the exit code (the worst host's). `rollout` (ops.rollouts.Control) records each batch."""
    strategy = strategy or Strategy(max_fail=len(hosts))
    rows: dict[str, dict] = {}
    failures = 0
    batches = strategy.batches(hosts)
    for number, batch in enumerate(batches):
        if failures > strategy.max_fail:
            break
        if rollout is not None:
            rollout.batch_started(number)
        width = min(len(batch), strategy.parallel or len(batch))
        with ThreadPoolExecutor(max_workers=width, thread_name_prefix="rollback") as pool:
            got = list(pool.map(lambda h: _rollback_one(h, to, connect=connect, root=root, echo=echo,
                                                        progress=progress, on_error=on_error,
                                                        seat=(seats or {}).get(h.name),
                                                        rollout=rollout.id if rollout is not None else None), batch))
        for host, row in zip(batch, got, strict=True):
            rows[host.name] = row
        failures += sum(1 for row in got if row["status"] == "error")
        if rollout is not None:
            rollout.rollback_batch_done(number, got, failures)
        if failures > strategy.max_fail and number < len(batches) - 1:
            echo(f"stopping: {failures} host(s) failed to roll back (--max-fail {strategy.max_fail})")
    for h in hosts:
        rows.setdefault(h.name, {"host": h.name, "status": "skipped", "reason": "not started: the rollback stopped",
                                 "exit_code": 1})
    return [rows[h.name] for h in hosts], max((r["exit_code"] for r in rows.values()), default=0)


def _rollback_one(host, to, *, connect: Connect, root: Path, echo, progress, on_error, seat, rollout) -> dict:
    from fleetspec.model.release import BASELINE
    from fleetspec.ops.rollback import rollback

    try:
        out = rollback(connect(host), host, root, None if to in (None, BASELINE) else to, echo=echo,
                       progress=progress, seat=seat, rollout=rollout)
        return out.to_json()
    except FleetspecError as err:
        on_error(err)
        return {"host": host.name, "status": "error", "reason": str(err), "exit_code": err.exit_code}
    except Exception as err:  # one host's surprise is its row; the next hosts still go
        wrapped = NeedsAttention(f"{host.name}: internal error: {type(err).__name__}: {str(err)[:300]}",
                                 f"fleetspec status {host.name}")
        on_error(wrapped)
        return {"host": host.name, "status": "error", "reason": str(wrapped), "exit_code": wrapped.exit_code}

"""`fleetspec deploy HOST --algo ALGO`: put an algo on one host's service, prove it, or put it back.

Read `Deploy.run` first: it runs ops/steps.py's STEPS in order, each by its method in `Deploy.work`.
`deploy()` makes a Deploy from what preflight found. Every step is written to the host's ledger
before it runs and after it ends. Nothing on the host changes before `lock`;
any failure after `switch` reverts to the previous good state (`_revert`), which is itself probed.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from fleetspec.errors import FleetspecError, NeedsAttention
from fleetspec.model import ledger as L
from fleetspec.model.layout import local_mirror
from fleetspec.model.release import BASELINE, Release, new_release_id
from fleetspec.ops import activation, planning, probes, rendering, smoke_run, staging, steps
from fleetspec.ops import preflight as preflight_mod
from fleetspec.ops.baseline import take_baseline
from fleetspec.ops.deploy_failure import FailurePath
from fleetspec.ops.deploy_router import RouterSteps
from fleetspec.ops.hoststate import HostState, LedgerWriteFailed
from fleetspec.ops.outcome import DeployOutcome, DeployRequest, Outcome, StepFailed
from fleetspec.ops.preflight_checks import check_interrupted
from fleetspec.ops.preflight_result import Preflight
from fleetspec.ops.redaction import secret_refs
from fleetspec.remote.api import TransportLike
from fleetspec.remote.lock import LockLost, RemoteLock
from fleetspec.remote.systemd import UnitStream


def deploy(t: TransportLike, req: DeployRequest, echo: Callable[[str], None] = print,
           progress: Callable[[str | None], None] = lambda line: None,
           on_start: Callable[[Deploy], None] = lambda d: None) -> DeployOutcome:
    """Preflight (read-only; refuses bad input before the host is touched), then the deploy it decided."""
    pf = preflight_mod.run(t, req, echo, progress)
    on_start(run := Deploy(t, req, pf, echo, progress))    # on a surprise, the caller can tell if it switched
    return run.run()


class Deploy(RouterSteps, FailurePath):
    def __init__(self, t: TransportLike, req: DeployRequest, pf: Preflight, echo: Callable[[str], None] = print,
                 progress: Callable[[str | None], None] = lambda line: None):
        self.t, self.req, self.pf = t, req, pf
        self.echo: Callable[[str], None] = lambda line: echo(pf.redact(line))        # no secret on the terminal …
        self.progress: Callable[[str | None], None] = lambda line: progress(pf.redact(line) if line else line)
        self.host = req.host
        self.service = req.host.vars.service
        self.state = HostState(t, req.host.name, self.service, mirror=local_mirror(req.root, req.host, self.service))
        self.state.rollout = req.rollout
        self.state.redact = pf.redact                                               # … nor in the ledger
        self.t = self.state.carrier()      # each command carries the deferred ledger lines
        self.release_id = req.release_id or new_release_id(req.playbook.algo)
        self.reuse_staged = req.release_id is not None   # a prestaged or staged-ahead release, taken if as planned
        self.started = time.monotonic()
        self.engine_wait = 0.0
        self.step_seconds: dict[str, float] = {}
        self.current_step = "preflight"
        self.switched = False
        self.release: Release | None = None
        self.smoke_run: smoke_run.SmokeRun | None = None        # started by stage, read by smoke
        self.smoke_error: FleetspecError | None = None
        self.previous: str | None = None   # release id that `current` pointed at before, None = baseline
        self.watch: UnitStream | None = None     # opened by restart, read (and closed) by probes
        self.router: Any = None                  # ops.drain.HostDrain, when the host joins a router
        self.bake_spec = getattr(req.playbook, "bake", None)     # the playbook's bake: (model/bake.py)
        self.bake_scrapes: list[str | None] = []  # the baseline's /metrics at the lock and before the switch
        self.work: dict[str, Callable[[], dict | None]] = {
            "preflight": self._record_preflight, "baseline": self._baseline, "stage": self._stage,
            "render": self._render, "measure": self._measure_before, "smoke": self._smoke, "switch": self._switch,
            "restart": self._restart, "probes": self._probes, "gates": self._gates, "commit": self._commit}

    # The operation --------------------------------------------------------------------------
    def run(self) -> DeployOutcome:
        if self.req.plan_only:
            return self._outcome(Outcome.PLANNED, plan=planning.plan(self.t, self.pf, self.state))
        if not self.reuse_staged and self.pf.staged_ahead:
            self.release_id, self.reuse_staged = self.pf.staged_ahead, True
            self.echo(self.pf.staged_ahead_note or "")
        with RemoteLock(self.state.t, str(self.state.layout.lock), release=self.release_id, note=self.echo,
                        **self.state.lock_reads) as lock:
            self.lock = lock
            self.state.lock = lock                  # every step's ledger line checks it is still ours
            self.state.supersede_staged(self.pf.staged_ahead_older if self.reuse_staged else (), self.release_id)
            try:
                return self._routed(self._locked)
            finally:
                self._router_last_word()

    def _locked(self) -> DeployOutcome:
        *proving, last = steps.order(self.req.playbook.smoke.when)
        self._bake_scrape()
        try:
            try:
                for name in proving:
                    if name == "switch":
                        self._bake_scrape()
                        self._take_out()
                    self.step(name, self.work[name])
            except StepFailed as failure:
                self._close_watch()
                if not self.switched:
                    self._stop_smoke()
                    self._mark(L.FAILED, step=failure.step, reason=failure.reason)
                    if failure.command:
                        return self._outcome(Outcome.NEEDS_ATTENTION, failure=failure, exit_code=3,
                                             command=failure.command)
                    return self._outcome(Outcome.FAILED, failure=failure, exit_code=1)
                return self._revert(failure)
            self.step(last, self.work[last])      # commit
            if self.bake_spec is not None:
                try:
                    self.step("bake", self._bake)
                except StepFailed as failure:
                    self._take_out(quiet=True)
                    return self._revert(failure)
            planning.prune_and_unlock(self.t, self.state, self.lock, self.prune_old, note=self.echo)
        except FleetspecError as err:      # the host was lost mid-way: even the ledger is out of reach
            return self._lost(err)
        return self._outcome(Outcome.HEALTHY)

    @property
    def staged(self) -> Release:
        """The release the stage step made (every step after it uses it)."""
        if self.release is None:
            raise FleetspecError(f"{self.host.name}: no release staged")
        return self.release

    # Step machinery -------------------------------------------------------------------------
    def step(self, name: str, fn: Callable[[], dict | None]) -> None:
        """Run one step between its ledger lines. Its "started" line rides in front of the step's
        first remote command (HostState.prelude: same shell, before the work) and its "ok" line
        with the next one. A write that fails there is charged as hoststate.charged_step says: to
        the step whose "ok" it carried, else to the step it started (see _lost)."""
        if self.req.pause_at == name:
            self._pause(name)
        self.state.defer(L.Entry.step(self.release_id, name, L.StepState.STARTED))
        self.current_step = name
        self.echo(f"[{self.host.name}] {name}")
        began = time.monotonic()
        try:
            detail = fn() or {}
        except StepFailed as failure:
            self.state.record(L.Entry.step(self.release_id, name, L.StepState.FAILED, reason=failure.reason,
                                           evidence=failure.evidence))
            raise
        except (LockLost, LedgerWriteFailed):
            raise                      # not ours any more / the ledger is not writable: straight to _lost
        except FleetspecError as err:
            self.state.record(L.Entry.step(self.release_id, name, L.StepState.FAILED, reason=str(err)))
            raise StepFailed(name, str(err)) from err
        except Exception as err:  # a bug must still end in a revert, never a host left mid-switch
            import traceback

            trace = traceback.format_exc(limit=8)
            reason = f"internal error: {type(err).__name__}: {err}"
            self.state.record(L.Entry.step(self.release_id, name, L.StepState.FAILED, reason=reason,
                                           traceback=trace))
            raise StepFailed(name, reason, {"traceback": trace}) from err
        finally:
            self.step_seconds[name] = round(time.monotonic() - began, 3)
        self.state.defer(L.Entry.step(self.release_id, name, L.StepState.OK, seconds=self.step_seconds[name],
                                      **detail))

    def _pause(self, name: str) -> None:
        """Test hook (FLEETSPEC_PAUSE_AT): announce the step and wait to be killed or continued."""
        import os
        import signal

        self.state.flush()     # a kill here must find the ledger as a deploy without pauses leaves it
        print(f"FLEETSPEC-PAUSED {name} {os.getpid()}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

    def _mark(self, status: str, **detail) -> None:
        self.state.record(L.Entry.status(self.release_id, status, **detail))

    # Steps ------------------------------------------------------------------------------------
    def _record_preflight(self) -> dict:
        # Again, under the lock: a deploy that got in (and died) since preflight's read-only look
        # must not become this deploy's "previous good state". The lock's holder read it once it
        # held the lock (RemoteLock read=): no command of its own.
        ledger = L.parse(self.lock.read_text or "")
        try:
            check_interrupted(self.state, self.host.name, ledger)
        except NeedsAttention as err:
            raise StepFailed("preflight", str(err).split(" — run: ")[0], command=err.command) from None
        abandoned = staging.abandon_unswitched(self.state, self.release_id, ledger)
        return dict(self.pf.summary(), abandoned=abandoned)

    def _baseline(self) -> dict:
        baseline = self.state.baseline_from_text(self.lock.read_texts[self.state.baseline_json], repair=True)
        if self.state.repaired:
            self.echo(self.state.repaired)
        if baseline is None:
            baseline = take_baseline(self.t, self.pf)
            self.state.write_baseline(baseline)
            image = (f", image {baseline.container.get('image')} {baseline.container.get('digest')}"
                     if baseline.container else "")
            self.echo(f"[{self.host.name}] baseline recorded: {baseline.declared_algorithm or 'none'} "
                      f"(unit sha256 {baseline.unit_sha256[:12]}{image})")
        drift = baseline.differences(self.pf.unit_bytes, self.pf.dropins,
                                     *secret_refs(self.host, self.pf.playbook))
        drift += baseline.container_changes(self.pf.container_facts)
        if drift:
            raise StepFailed("baseline", "the service changed by hand since the baseline: " + "; ".join(drift)
                             + f" — review it, then run: fleetspec baseline {self.host.name} --retake")
        self.pf.baseline = baseline
        self.previous = self.state.current(self.lock.link_target)
        self.previous_known = True
        return {"unit_sha256": baseline.unit_sha256, "previous": self.previous or BASELINE,
                **({"image_digest": baseline.container.get("digest")} if baseline.container else {})}

    def _stage(self) -> dict:
        run, then = smoke_run.prepare(self.pf, self.state, self.release_id)
        staged = staging.stage(self.t, self.pf, self.state, self.release_id, self.previous, mode=self.req.mode,
                                 reuse=self.reuse_staged, then=then,
                                 ledger=L.parse(self.lock.read_text or ""))    # read under the lock
        self.release, self.smoke_run = staged.release, run     # the runner started in the same command
        self.state.defer(L.Entry.status(self.release_id, L.STAGED))   # with the next step's first line
        if staged.smoke_error:              # the smoke step reports it, where the verdict would be
            self.smoke_error = FleetspecError(staged.smoke_error)
        if staged.smoke_reused:
            self.echo(f"[{self.host.name}] smoke: the verdict of {staged.smoke_reused['release']} is replayed "
                      "(same tests and release content; nothing under the host python's import path changed "
                      "since it ran; the playbook's smoke.reuse: false runs them again)")
        return {"files": len(self.release.files), "kernels": len(self.release.kernels),
                "sent_bytes": staged.sent or 0, **({"prestaged": True} if staged.sent is None else {}),
                **({"smoke_kept": True} if staged.smoke_kept else {}),
                **({"smoke_reused": staged.smoke_reused} if staged.smoke_reused else {})}

    def _smoke(self) -> dict:
        """The verdict of the smoke runner `stage` started (it ran while render and measure did)."""
        if self.smoke_error is not None or self.smoke_run is None:
            raise self.smoke_error or StepFailed("smoke", "the smoke tests were not started")
        try:
            detail = smoke_run.finish(self.t, self.smoke_run)
        finally:
            self.smoke_run = None          # ended: nothing left to stop
        self.kernel = {k: detail[k] for k in ("candidates", "kernel_note") if k in detail}
        smoke_run.tell(detail, self.host.name, self.echo)
        return detail

    def _stop_smoke(self) -> None:
        """A deploy failing before the switch ends its smoke runner rather than leave it to its timeout."""
        if self.smoke_run is None or not self.smoke_run.scripts:
            return
        try:
            smoke_run.stop(self.t, self.state, self.release_id)
        except FleetspecError as err:      # the runner's own timeout still ends it
            self.echo(f"[{self.host.name}] note: could not stop the smoke runner: {err}")

    def _render(self) -> dict:
        return rendering.render_release(self.t, self.pf, self.state, self.staged)

    def _measure_before(self) -> dict:
        """The same host's figures on what it serves now, for the gates to compare against."""
        from fleetspec.ops import gates

        if not self.req.run_gates or not gates.needs_baseline(gates.for_host(self.pf.playbook.gates, self.host)):
            return {"skipped": True}
        self.pf.before = before = gates.measure_baseline(self.t, self.pf)     # never a partial one
        return {"figures": before.figures()}

    def _switch(self) -> dict:
        # SWITCHED rides in front of the first file change, in the same shell (`&&`): durable before it.
        mark = L.Entry.status(self.release_id, L.SWITCHED, previous=self.previous or BASELINE)
        self.state.defer(mark)
        hook = (lambda: self._pause("switch.files")) if self.req.pause_at == "switch.files" else None
        try:
            unit = activation.activate(self.t, self.state, self.staged, after_files=hook)
        finally:
            self.switched = self.state.was_sent(mark)
            if not self.switched:
                self.state.discard(mark)          # nothing was changed: the ledger must not say so
        mismatch = activation.loaded_exec_start_mismatch(self.t, self.service, self.staged, unit)
        if mismatch:   # an admin drop-in wins over ours: never restart onto the old command
            raise StepFailed("switch", f"after daemon-reload systemd does not hold the derived ExecStart ({mismatch}); "
                                       f"an admin drop-in probably overrides fleetspec's {self.state.dropin}")
        return {}

    def _restart(self) -> dict:
        self.spec = self.pf.probe_spec(self.pf.playbook_algorithm)
        self.watch, self.restarted = probes.restart_watched(self.t, self.service, self.spec)  # probes reads on
        return {"n_restarts_before": self.restarted.n_restarts}

    def _close_watch(self) -> None:
        """The restart's watch, when a step between the restart and the probes (a smoke verdict
        beside the load) failed: the revert restarts again and watches for itself."""
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.close()

    def _probes(self) -> dict:
        began = time.monotonic()
        watch, self.watch = self.watch, None          # wait_healthy closes it
        result = probes.wait_healthy(self.t, self.service, self.spec, since=self.restarted, stream=watch,
                                     progress=self._progress)
        self.engine_wait += time.monotonic() - began
        self._progress(None)
        if not result.ok:
            evidence = dict(result.evidence, journal=activation.journal_tail(self.t, self.service))
            raise StepFailed("probes", f"{result.stage}: {result.reason}", evidence)
        return {"waited_s": round(result.waited_s, 2), "served": result.evidence.get("speculative_algorithm"),
                "accept_length": result.evidence.get("generate", {}).get("accept_length")}

    def _gates(self) -> dict:
        if not self.req.run_gates:
            return {"skipped": True}
        from fleetspec.ops import gates

        verdicts = gates.evaluate(self.t, self.pf, self.state, self.release, echo=self.echo)
        figures = {v.name: v.figures for v in verdicts}
        self.figures = figures
        blocking = [v for v in verdicts if v.blocks]
        if blocking:
            raise StepFailed("gates", "; ".join(f"{v.name} {v.verdict}: {v.reason}" for v in blocking),
                             {"figures": figures})
        return {"figures": figures}

    def _commit(self) -> dict:
        self.state.defer(L.Entry.status(self.release_id, L.HEALTHY))   # what to prune: known, no read
        self.prune_old = planning.to_prune(self.state, self.lock.read_text, self.release_id,
                                           self.pf.keep_releases if self.req.prune else 0, protect=[self.previous])
        return {"prune": self.prune_old}     # each one's PRUNED line follows its removal

    # Output -----------------------------------------------------------------------------------
    def _progress(self, line: str | None) -> None:
        self.progress(f"[{self.host.name}] {line}" if line else None)

    def _outcome(self, status: Outcome, *, failure: StepFailed | None = None, exit_code: int = 0,
                 reason: str = "", plan: planning.Plan | None = None, command: str | None = None) -> DeployOutcome:
        out = DeployOutcome(self.host.name, status, None if plan else self.release_id,
                            failure.step if failure else None,
                            reason or (f"{failure.step}: {failure.reason}" if failure else ""),
                            failure.evidence if failure else {}, getattr(self, "figures", {}), plan,
                            round(time.monotonic() - self.started, 2), round(self.engine_wait, 2), exit_code)
        if command:
            out.evidence["command"] = command
        out.step_seconds = dict(self.step_seconds)
        out.revert_wait_s = round(getattr(self, "revert_wait", 0.0), 2)
        out.previous = (self.previous or BASELINE) if getattr(self, "previous_known", False) else None
        out.kernel = dict(getattr(self, "kernel", {}))
        out.reason = self.pf.redact(out.reason)
        out.evidence = json.loads(self.pf.redact(json.dumps(out.evidence, default=str)))
        return out


"""The deploy's router and bake steps (a part of ops/deploy.py's Deploy): the worker out of its
router around the restart and back when healthy, whatever happened; the committed release watched
on its engine's own metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from fleetspec.errors import FleetspecError
from fleetspec.ops.outcome import DeployOutcome, Outcome, StepFailed


class RouterSteps:
    if TYPE_CHECKING:     # the rest of Deploy's state (ops/deploy.py)
        def __getattr__(self, name: str) -> Any: ...

    # The router (ops/drain.py) ----------------------------------------------------------------
    def _routed(self, body: Callable[[], DeployOutcome]) -> DeployOutcome:
        """A removal a cut-off command left goes back first; the worker leaves the router just
        before the switch and goes back once the host is healthy again (on the release, or
        reverted and proved): a rolled-back or healthy outcome waits for the router to list it."""
        seat = self.req.seat
        if seat is None:
            return body()
        from fleetspec.ops import drain

        self.router = drain.HostDrain(seat, self.state.record, drain.engine_in_flight(self.t, self.host),
                                      self.echo, self.host.name)
        self.router.restore_pending(self.lock.read_text or "")
        out = body()
        if out.status in (Outcome.HEALTHY, Outcome.ROLLED_BACK) and self.router.out:
            try:
                self.router.put_back(healthy=True)
            except FleetspecError as err:
                out.status, out.exit_code = Outcome.NEEDS_ATTENTION, 3
                out.reason = f"{out.reason + '; ' if out.reason else ''}its router did not list it healthy again: {err}"
                out.evidence["command"] = f"fleetspec status {self.host.name}"
        out.router = self.router.summary()
        return out

    def _take_out(self, quiet: bool = False) -> None:
        """Out of the router before the switch (a failure there fails the deploy before any
        change), or before a failed bake's revert (`quiet`: the revert goes on regardless)."""
        if self.router is None:
            return
        try:
            self.router.take_out()
        except Exception as err:  # any error is this step's failure; ensure_back puts it back
            if quiet:
                self.echo(f"[{self.host.name}] could not take it out of its router before the revert: {err}")
                return
            raise StepFailed("switch", f"router {self.router.seat.spec.name}: could not take the worker out: {err}") from err

    # The bake (ops/bake.py) -------------------------------------------------------------------
    def _bake_scrape(self) -> None:
        """The baseline's /metrics, at the lock and just before the switch: its figures between."""
        if self.bake_spec is None:
            return
        from fleetspec.ops import bake

        self.bake_scrapes.append(bake.scraper(self.t, self.host)())

    def _bake(self) -> dict:
        """Watch the committed release, back in its router and serving, against the baseline's figures."""
        from fleetspec.ops import bake

        spec = self.bake_spec
        assert spec is not None
        self.state.flush()           # its "started" line now: `status` shows the host baking
        if self.router is not None and self.router.out:
            try:
                self.router.put_back(healthy=True)
            except FleetspecError as err:
                raise StepFailed("bake", f"its router did not list it healthy again: {err}") from err
        scrapes = self.bake_scrapes + [None, None]
        base = bake.baseline_figures(scrapes[0], scrapes[1])
        verdict = bake.watch(spec, base, bake.scraper(self.t, self.host), note=self._progress)
        self._progress(None)
        figures = {"outcome": verdict.outcome, "reasons": list(verdict.reasons),
                   **{f"release_{k}": v for k, v in verdict.release.items()},
                   **{f"baseline_{k}": v for k, v in verdict.baseline.items() if k in ("accept_length", "p99_s")}}
        self.figures = {**getattr(self, "figures", {}), "bake": figures}
        if not verdict.ok:
            raise StepFailed("bake", f"{verdict.outcome}: " + "; ".join(verdict.reasons), {"figures": {"bake": figures}})
        return {"figures": {"bake": figures}}

    def _router_last_word(self) -> None:
        if self.router is not None:
            self.router.ensure_back()

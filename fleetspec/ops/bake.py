"""The bake's judge (pure): the release's figures against the baseline's, taken before the switch.

Inconclusive (too few requests, a figure missing) fails closed, as a gate does (Argo Rollouts).
A figure the engine exported as NaN or ±Inf is missing (`Figures.missing`), on either side:
every comparison with NaN is false, so it would otherwise pass whatever the release did."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from fleetspec.errors import FleetspecError
from fleetspec.model.bake import BakeSpec
from fleetspec.remote.prometheus import Figures, figures

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


@dataclass(frozen=True)
class Verdict:
    outcome: str
    reasons: tuple[str, ...]
    baseline: dict
    release: dict

    @property
    def ok(self) -> bool:
        return self.outcome == PASS


def judge(spec: BakeSpec, baseline: Figures, release: Figures) -> Verdict:
    fails: list[str] = []
    unknown: list[str] = [f"the {side}'s {what}" for side, figs in (("baseline", baseline), ("release", release))
                          for what in figs.missing]
    if release.requests + release.aborted < spec.min_requests:
        unknown.append(f"{release.requests + release.aborted:.0f} requests seen, "
                       f"fewer than min_requests {spec.min_requests}")
    rate = release.error_rate
    if rate is not None and rate > spec.max_error_rate:
        fails.append(f"error rate {rate:.3f} > max_error_rate {spec.max_error_rate}")
    if spec.min_accept_ratio is not None:
        if baseline.accept_length and release.accept_length is not None:
            ratio = release.accept_length / baseline.accept_length
            if ratio < spec.min_accept_ratio:
                fails.append(f"accept length {release.accept_length:.2f} is {ratio:.2f} x the baseline's "
                             f"{baseline.accept_length:.2f} < min_accept_ratio {spec.min_accept_ratio}")
        elif baseline.accept_length:
            unknown.append("the release exports no sglang:spec_accept_length")
    if spec.max_p99_ratio is not None:
        if baseline.p99 and release.p99 is not None:
            ratio = release.p99 / baseline.p99
            if ratio > spec.max_p99_ratio:
                fails.append(f"p99 latency {release.p99:.3f} s is {ratio:.2f} x the baseline's "
                             f"{baseline.p99:.3f} s > max_p99_ratio {spec.max_p99_ratio}")
        elif baseline.p99:
            unknown.append("no e2e latency observations for the release")
    outcome = FAIL if fails else INCONCLUSIVE if unknown else PASS
    return Verdict(outcome, tuple(fails + unknown), baseline.as_dict(), release.as_dict())


Scrape = Callable[[], "str | None"]


def scraper(t, host) -> Scrape:
    """The engine's /metrics text through the host's link; None when it does not answer 200."""
    from fleetspec.remote.sglang_api import auth_headers

    key = host.vars.api_key.value() if host.vars.api_key else None

    def read() -> str | None:
        try:
            r = t.http("GET", host.vars.api_port, "/metrics", timeout=10, headers=auth_headers(key))
        except FleetspecError:
            return None
        return r.body.decode("utf-8", "replace") if r.status == 200 else None
    return read


def baseline_figures(first: str | None, last: str | None) -> Figures:
    """What the engine did before the switch (empty figures when it exports no metrics: then only
    the error rate and min_requests are judged)."""
    if first is None or last is None:
        return Figures(0.0, 0.0, None, None)
    return figures(first, last)


def watch(spec: BakeSpec, baseline: Figures, scrape: Scrape, note: Callable[[str], None] = lambda line: None,
          sleep: Callable[[float], None] = time.sleep) -> Verdict:
    """Scrape every `interval` for `duration` seconds after commit; stops early on a regression
    seen over at least min_requests requests. The end verdict covers the whole watch."""
    first = scrape()
    if first is None:
        return Verdict(INCONCLUSIVE, ("the release's /metrics does not answer (is --enable-metrics set?)",),
                       baseline.as_dict(), {})
    began = time.monotonic()
    verdict = judge(spec, baseline, figures(first, first))
    while (left := spec.duration - (time.monotonic() - began)) > 0:
        sleep(min(spec.interval, left))
        now = scrape()
        if now is None:
            return Verdict(FAIL, ("the release's /metrics stopped answering",), baseline.as_dict(),
                           verdict.release)
        seen = figures(first, now)
        verdict = judge(spec, baseline, seen)
        note(f"bake {time.monotonic() - began:.0f}/{spec.duration:.0f}s: {seen.requests + seen.aborted:.0f} "
             f"requests, {verdict.outcome}")
        if verdict.outcome == FAIL and seen.requests + seen.aborted >= spec.min_requests:
            break
    return verdict

"""The bake's judge (pure): the release's figures against the baseline's, taken before the switch.

Inconclusive (too few requests, a figure missing) fails closed, as a gate does (Argo Rollouts)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetspec.model.bake import BakeSpec
from fleetspec.remote.prometheus import Figures

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
    unknown: list[str] = []
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

"""Prometheus text exposition (format 0.0.4, what sglang's prometheus_client and sglang-router
serve on /metrics), read with prometheus_client's own parser, and the figures the bake reads from
two scrapes of an engine.

A scrape comes from the host, so it is data to doubt: a value that is not a finite number (`NaN`
from a 0/0 gauge, `+Inf`) makes every comparison false, so such a figure is missing, never a
number; a scrape the parser refuses is missing whole. Nothing here raises on what a host sent."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


class Unreadable(ValueError):
    """A scrape prometheus_client's parser refuses (the whole scrape: its figures are missing)."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def parse(text: str) -> list[Sample]:
    """Every sample of a scrape, values as the engine wrote them (NaN and ±Inf included: the
    readers below treat them as missing). Unreadable when the parser refuses any line."""
    try:
        return [Sample(s.name, tuple((str(k), str(v)) for k, v in s.labels.items()), float(s.value))
                for family in text_string_to_metric_families(text) for s in family.samples]
    except Exception as err:  # a hostile scrape must be "missing", whatever the parser met
        raise Unreadable(f"/metrics is not Prometheus text ({type(err).__name__}: {str(err)[:120]})") from None


def total(samples: list[Sample], name: str) -> float | None:
    """The sum over every label set of `name` (sglang 0.5.23 splits requests by is_streaming);
    None when absent or when any of its values (or their sum) is not finite."""
    values = [s.value for s in samples if s.name == name]
    if not values:
        return None
    out = math.fsum(values) if all(math.isfinite(v) for v in values) else math.nan
    return out if math.isfinite(out) else None


def unreadable(samples: list[Sample], names: tuple[str, ...]) -> list[str]:
    """Which of `names` (a histogram's name covers its _bucket/_sum/_count) carry a value that is
    not finite: such a figure is missing, and a missing figure fails the bake closed."""
    bad = {s.name for s in samples if not math.isfinite(s.value)}
    return [n for n in names if bad & {n, n + "_bucket"}]


def histogram(samples: list[Sample], name: str) -> dict[float, float]:
    """Cumulative bucket counts of `name`, summed over label sets: {upper bound: count}. Empty
    (no observations) when a count or a bound is not a number."""
    out: dict[float, float] = {}
    for s in samples:
        le = s.label("le")
        if s.name != name + "_bucket" or le is None:
            continue
        try:
            bound = float(le)
        except ValueError:
            return {}
        if math.isnan(bound) or not math.isfinite(s.value):
            return {}
        out[bound] = out.get(bound, 0.0) + s.value
    return out


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated inside its bucket as PromQL's
    histogram_quantile does; None without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for b in bounds:
        count = buckets[b]
        if count >= rank:
            if math.isinf(b):
                return lower
            return lower + (b - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = b, count
    return lower


REQUESTS = "sglang:num_requests_total"
ABORTED = "sglang:num_aborted_requests_total"
ACCEPT = "sglang:spec_accept_length"
E2E = "sglang:e2e_request_latency_seconds"
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"


@dataclass(frozen=True)
class Figures:
    """What an engine did between two scrapes: counters as differences, the accept length as the
    gauge at the end, p99 from the histogram's difference. `missing` says what a scrape held but
    not as a finite number (or that the parser refused a scrape): the judge fails closed on it."""

    requests: float
    aborted: float
    accept_length: float | None
    p99: float | None
    missing: tuple[str, ...] = ()

    @property
    def error_rate(self) -> float | None:
        seen = self.requests + self.aborted
        return self.aborted / seen if seen else None

    def as_dict(self) -> dict[str, float | None]:
        return {"requests": self.requests, "aborted": self.aborted, "error_rate": self.error_rate,
                "accept_length": self.accept_length, "p99_s": self.p99}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def figures(before: str, after: str) -> Figures:
    """A counter that went down means the engine restarted between the scrapes: then every
    figure is the second scrape's own (all counters restarted from zero together)."""
    try:
        a, b = parse(before), parse(after)
    except Unreadable as err:
        return Figures(0.0, 0.0, None, None, (str(err),))
    bad = unreadable(a, (REQUESTS, ABORTED, E2E)) + unreadable(b, (REQUESTS, ABORTED, ACCEPT, E2E))
    missing = tuple(f"{n} is not a finite number" for n in dict.fromkeys(bad))
    hb, ha = histogram(b, E2E), histogram(a, E2E)
    names = (REQUESTS, ABORTED)
    reset = any((total(b, n) or 0.0) < (total(a, n) or 0.0) for n in names) or any(
        hb.get(k, 0.0) < v for k, v in ha.items())

    def delta(name: str) -> float:
        end = total(b, name) or 0.0
        return end if reset else end - (total(a, name) or 0.0)

    if not reset:
        hb = {k: v - ha.get(k, 0.0) for k, v in hb.items()}
    requests, aborted = delta(REQUESTS), delta(ABORTED)
    if not (math.isfinite(requests) and math.isfinite(aborted)) or requests < 0 or aborted < 0:
        missing += ("request counters are not finite counts",)
        requests, aborted = 0.0, 0.0
    return Figures(requests, aborted, total(b, ACCEPT), _finite(quantile(hb, 0.99)), missing)


def in_flight(text: str) -> int | None:
    """Requests the engine holds (running + queued); None when it exports neither gauge as a
    finite count, or the scrape is not Prometheus text: unknown, never an exception."""
    try:
        samples = parse(text)
    except Unreadable:
        return None
    if unreadable(samples, (RUNNING, QUEUED)):
        return None
    running, queued = total(samples, RUNNING), total(samples, QUEUED)
    if running is None and queued is None:
        return None
    held = (running or 0.0) + (queued or 0.0)
    return int(held) if math.isfinite(held) and 0 <= held < 2**53 else None

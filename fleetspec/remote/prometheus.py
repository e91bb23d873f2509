"""A pure parser of Prometheus text exposition (format 0.0.4, what sglang's prometheus_client and
sglang-router serve on /metrics), and the figures the bake reads from two scrapes of an engine."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def _unescape(text: str) -> str:
    return text.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def parse(text: str) -> list[Sample]:
    """Every sample line; comments, blank and malformed lines skipped (a scrape is read, not checked)."""
    out: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        labels = tuple((k, _unescape(v)) for k, v in _LABEL.findall(m["labels"] or ""))
        out.append(Sample(m["name"], labels, value))
    return out


def total(samples: list[Sample], name: str) -> float | None:
    """The sum over every label set of `name` (sglang 0.5.23 splits requests by is_streaming)."""
    values = [s.value for s in samples if s.name == name]
    return sum(values) if values else None


def histogram(samples: list[Sample], name: str) -> dict[float, float]:
    """Cumulative bucket counts of `name`, summed over label sets: {upper bound: count}."""
    out: dict[float, float] = {}
    for s in samples:
        if s.name == name + "_bucket" and s.label("le") is not None:
            le = math.inf if s.label("le") == "+Inf" else float(s.label("le") or "nan")
            out[le] = out.get(le, 0.0) + s.value
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
    gauge at the end, p99 from the histogram's difference."""

    requests: float
    aborted: float
    accept_length: float | None
    p99: float | None

    @property
    def error_rate(self) -> float | None:
        seen = self.requests + self.aborted
        return self.aborted / seen if seen else None

    def as_dict(self) -> dict[str, float | None]:
        return {"requests": self.requests, "aborted": self.aborted, "error_rate": self.error_rate,
                "accept_length": self.accept_length, "p99_s": self.p99}


def figures(before: str, after: str) -> Figures:
    """A counter that went down means the engine restarted between the scrapes: then every
    figure is the second scrape's own (all counters restarted from zero together)."""
    a, b = parse(before), parse(after)
    hb, ha = histogram(b, E2E), histogram(a, E2E)
    names = (REQUESTS, ABORTED)
    reset = any((total(b, n) or 0.0) < (total(a, n) or 0.0) for n in names) or any(
        hb.get(k, 0.0) < v for k, v in ha.items())

    def delta(name: str) -> float:
        end = total(b, name) or 0.0
        return end if reset else end - (total(a, name) or 0.0)

    if not reset:
        hb = {k: v - ha.get(k, 0.0) for k, v in hb.items()}
    return Figures(delta(REQUESTS), delta(ABORTED), total(b, ACCEPT), quantile(hb, 0.99))


def in_flight(text: str) -> int | None:
    """Requests the engine holds (running + queued); None when it exports neither gauge."""
    samples = parse(text)
    running, queued = total(samples, RUNNING), total(samples, QUEUED)
    if running is None and queued is None:
        return None
    return int((running or 0) + (queued or 0))

"""/metrics in Prometheus text format with sglang's own metric names, types and labels
(sglang/srt/observability/metrics_collector.py, 0.5.13.post1 and 0.5.23), stdlib only so the thin
engine serves it too. Stand-in figures: they count what the stand-in did, not a GPU's work."""

from __future__ import annotations

import bisect
import threading

# sglang's default bucket_e2e_request_latency (both versions).
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)

HELP = {
    "sglang:num_requests_total": ("counter", "Number of requests processed."),
    "sglang:num_aborted_requests_total": ("counter", "Number of requests aborted."),
    "sglang:prompt_tokens_total": ("counter", "Number of prefill tokens processed."),
    "sglang:generation_tokens_total": ("counter", "Number of generation tokens processed."),
    "sglang:num_running_reqs": ("gauge", "The number of running requests."),
    "sglang:num_queue_reqs": ("gauge", "The number of requests in the waiting queue."),
    "sglang:spec_accept_length": ("gauge", "Mean acceptance length of speculative decoding "
                                           "(accepted drafts + bonus token per forward)."),
    "sglang:spec_accept_rate": ("gauge", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
    "sglang:e2e_request_latency_seconds": ("histogram", "Histogram of End-to-end request latency in seconds"),
}


def _num(value: float) -> str:
    return repr(float(value)) if value != int(value) else f"{float(value):.1f}"


class Metrics:
    """Counters as sglang's collectors keep them. A request the stand-in answers with an error (the
    fail_requests_after fault) counts as aborted: sglang counts a request its engine gave up on in
    num_aborted_requests_total and has no other failure counter."""

    def __init__(self, model_name: str):
        self.labels = f'model_name="{model_name}",engine_type="unified"'
        self.lock = threading.Lock()
        self.counts = {"sglang:num_requests_total": 0.0, "sglang:num_aborted_requests_total": 0.0,
                       "sglang:prompt_tokens_total": 0.0, "sglang:generation_tokens_total": 0.0}
        self.running = 0
        self.accept_length: float | None = None
        self.accept_rate: float | None = None
        self.buckets = [0] * (len(E2E_BUCKETS) + 1)
        self.e2e_sum = 0.0
        self.e2e_count = 0

    def started(self) -> None:
        with self.lock:
            self.running += 1

    def finished(self, prompt_tokens: int, generation_tokens: int, e2e: float,
                 accept_length: float | None = None, accept_rate: float | None = None) -> None:
        with self.lock:
            self.running -= 1
            self.counts["sglang:num_requests_total"] += 1
            self.counts["sglang:prompt_tokens_total"] += prompt_tokens
            self.counts["sglang:generation_tokens_total"] += generation_tokens
            self.buckets[bisect.bisect_left(E2E_BUCKETS, e2e)] += 1
            self.e2e_sum += e2e
            self.e2e_count += 1
            if accept_length is not None:
                self.accept_length, self.accept_rate = accept_length, accept_rate

    def aborted(self, was_running: bool = False) -> None:
        with self.lock:
            if was_running:
                self.running -= 1
            self.counts["sglang:num_aborted_requests_total"] += 1

    def render(self) -> str:
        lab = self.labels
        out: list[str] = []

        def head(name: str) -> None:
            # prometheus_client names a counter's family without `_total`, its sample with it.
            kind, text = HELP[name]
            family = name.removesuffix("_total") if kind == "counter" else name
            out.extend([f"# HELP {family} {text}", f"# TYPE {family} {kind}"])

        with self.lock:
            for name, value in self.counts.items():
                head(name)
                out.append(f"{name}{{{lab}}} {_num(value)}")
            gauges = {"sglang:num_running_reqs": self.running, "sglang:num_queue_reqs": 0}
            if self.accept_length is not None:
                gauges["sglang:spec_accept_length"] = self.accept_length
                gauges["sglang:spec_accept_rate"] = self.accept_rate or 0.0
            for name, value in gauges.items():
                head(name)
                out.append(f"{name}{{{lab}}} {_num(value)}")
            name = "sglang:e2e_request_latency_seconds"
            head(name)
            total = 0
            for bound, n in zip([*E2E_BUCKETS, float("inf")], self.buckets, strict=True):
                total += n
                le = "+Inf" if bound == float("inf") else _num(bound)
                out.append(f'{name}_bucket{{{lab},le="{le}"}} {_num(total)}')
            out.append(f"{name}_sum{{{lab}}} {_num(self.e2e_sum)}")
            out.append(f"{name}_count{{{lab}}} {_num(self.e2e_count)}")
        return "\n".join(out) + "\n"

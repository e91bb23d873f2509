"""The playbook's `bake:` (watch a release on the engine's own metrics after commit) and `stop:`
(how long systemd lets the engine drain on SIGTERM: TimeoutStopSec)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetspec.model.yamlload import Fields

# sglang (0.5.13.post1 and 0.5.23, tokenizer_manager.sigterm_watchdog) checks for SIGTERM every 5 s,
# then polls the requests left every 5 s; 0.5.23 then waits up to 15 s for its schedulers to exit.
SIGTERM_POLL_S = 5
SCHEDULER_EXIT_S = 15
MIN_STOP_S, MAX_STOP_S, UNKNOWN_CONTEXT_STOP_S = 30, 1800, 600


@dataclass(frozen=True)
class BakeSpec:
    duration: float = 300.0
    interval: float = 15.0
    max_error_rate: float = 0.01
    min_accept_ratio: float | None = 0.9
    max_p99_ratio: float | None = 1.5
    min_requests: int = 20


@dataclass(frozen=True)
class StopSpec:
    timeout: int | None = None          # TimeoutStopSec; None: derived (stop_timeout)
    min_decode_tps: float = 30.0        # the slowest decode rate a generation is allowed


def _ratio(f: Fields, name: str, default: float | None, low: float, high: float | None) -> float | None:
    value: float | None = f.get(name, float, default)
    if value is not None and (value < low or (high is not None and value > high)):
        f.fail(name, f"expected a number from {low} to {high}, got {value}" if high is not None
               else f"expected a number >= {low}, got {value}")
    return value


def bake_from(top: Fields) -> BakeSpec | None:
    f = top.optional_sub("bake")
    if f is None:
        return None
    duration = f.get("duration", float, BakeSpec.duration)
    interval = f.get("interval", float, BakeSpec.interval)
    if duration <= 0:
        f.fail("duration", f"expected a positive number of seconds, got {duration}")
    if not 0 < interval <= duration:
        f.fail("interval", f"expected a positive number of seconds, at most duration ({duration}), got {interval}")
    spec = BakeSpec(duration=duration, interval=interval,
                    max_error_rate=_ratio(f, "max_error_rate", BakeSpec.max_error_rate, 0.0, 1.0) or 0.0,
                    min_accept_ratio=_ratio(f, "min_accept_ratio", BakeSpec.min_accept_ratio, 0.0, None),
                    max_p99_ratio=_ratio(f, "max_p99_ratio", BakeSpec.max_p99_ratio, 1.0, None),
                    min_requests=f.get("min_requests", int, BakeSpec.min_requests))
    if spec.min_requests < 0:
        f.fail("min_requests", f"expected 0 or more, got {spec.min_requests}")
    f.done()
    return spec


def stop_from(top: Fields) -> StopSpec:
    f = top.sub("stop")
    timeout = f.get("timeout", int, None)
    if timeout is not None and not 1 <= timeout <= 86400:
        f.fail("timeout", f"expected seconds from 1 to 86400 (TimeoutStopSec), got {timeout}")
    tps = f.get("min_decode_tps", float, StopSpec.min_decode_tps)
    if tps <= 0:
        f.fail("min_decode_tps", f"expected a positive number of tokens per second, got {tps}")
    f.done()
    return StopSpec(timeout=timeout, min_decode_tps=tps)


def stop_timeout(stop: StopSpec, context_length: int | None) -> int:
    """TimeoutStopSec: the playbook's, else the longest generation the host allows (its
    --context-length at min_decode_tps) plus sglang's SIGTERM poll and scheduler exit, within
    [30, 1800] s; 600 s when the context length is unknown."""
    if stop.timeout is not None:
        return stop.timeout
    if not context_length:
        return UNKNOWN_CONTEXT_STOP_S
    seconds = context_length / stop.min_decode_tps + 2 * SIGTERM_POLL_S + SCHEDULER_EXIT_S
    return int(min(MAX_STOP_S, max(MIN_STOP_S, round(seconds))))

"""The Prometheus parser on the stand-in's real output, the bake's judge, and the router, bake and
stop keys validated at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetspec.errors import ConfigError
from fleetspec.model.bake import BakeSpec, StopSpec, stop_timeout
from fleetspec.model.inventory import load_inventory
from fleetspec.model.playbook import load_playbook
from fleetspec.ops.bake import FAIL, INCONCLUSIVE, PASS, judge
from fleetspec.remote import prometheus
from fleetspec.remote.prometheus import Figures

CAPTURED = (Path(__file__).parent / "data" / "standin_metrics.txt").read_text()


def test_parser_reads_the_stand_ins_metrics_as_sglang_names_them():
    samples = prometheus.parse(CAPTURED)
    assert prometheus.total(samples, prometheus.REQUESTS) == 4
    assert prometheus.total(samples, prometheus.ABORTED) == 1
    assert prometheus.total(samples, prometheus.ACCEPT) == 3.2
    buckets = prometheus.histogram(samples, prometheus.E2E)
    assert buckets[0.1] == 1 and buckets[0.4] == 3 and buckets[2] == 4 and buckets[float("inf")] == 4
    assert prometheus.quantile(buckets, 0.5) == pytest.approx(0.2 + 0.2 * (2 - 1) / 2)
    assert 1 < prometheus.quantile(buckets, 0.99) <= 2
    assert prometheus.in_flight(CAPTURED) == 0


def test_parser_sums_label_sets_and_reads_escapes_and_timestamps():
    text = ('sglang:num_requests_total{model_name="m",is_streaming="true"} 3.0\n'
            'sglang:num_requests_total{model_name="m \\"q\\"",is_streaming="false"} 4 1700000000000\n')
    samples = prometheus.parse(text)
    assert prometheus.total(samples, prometheus.REQUESTS) == 7
    assert samples[1].label("model_name") == 'm "q"'
    assert prometheus.in_flight(text) is None


def test_a_scrape_that_is_not_prometheus_text_is_missing_whole():
    text = 'sglang:num_requests_total 3\ngarbage line\nsglang:num_running_reqs{model_name="m"} NaNx\n'
    with pytest.raises(prometheus.Unreadable):
        prometheus.parse(text)
    assert prometheus.in_flight(text) is None
    f = prometheus.figures(text, text)
    assert f.missing and judge(BakeSpec(min_requests=0), BASE, f).outcome == INCONCLUSIVE


def test_figures_are_differences_between_two_scrapes():
    before = CAPTURED
    after = CAPTURED.replace("num_requests_total{model_name=\"/models/m\",engine_type=\"unified\"} 4.0",
                             "num_requests_total{model_name=\"/models/m\",engine_type=\"unified\"} 14.0")
    f = prometheus.figures(before, after)
    assert f.requests == 10 and f.aborted == 0 and f.error_rate == 0 and f.p99 is None
    restarted = prometheus.figures(after, CAPTURED)        # counters reset by a restart
    assert restarted.requests == 4 and restarted.aborted == 1


BASE = Figures(requests=100, aborted=0, accept_length=3.0, p99=1.0)


@pytest.mark.parametrize("release, outcome, reason", [
    (Figures(100, 0, 2.9, 1.1), PASS, None),
    (Figures(90, 10, 3.0, 1.0), FAIL, "error rate 0.100 > max_error_rate 0.01"),
    (Figures(100, 0, 2.0, 1.0), FAIL, "accept length 2.00 is 0.67 x"),
    (Figures(100, 0, 3.0, 2.0), FAIL, "p99 latency 2.000 s is 2.00 x"),
    (Figures(5, 0, 3.0, 1.0), INCONCLUSIVE, "5 requests seen, fewer than min_requests 20"),
    (Figures(100, 0, None, 1.0), INCONCLUSIVE, "exports no sglang:spec_accept_length"),
])
def test_judge(release, outcome, reason):
    verdict = judge(BakeSpec(), BASE, release)
    assert verdict.outcome == outcome
    assert reason is None and verdict.reasons == () or any(reason in r for r in verdict.reasons)


def test_stop_timeout_comes_from_the_longest_generation():
    assert stop_timeout(StopSpec(timeout=90), 131072) == 90
    assert stop_timeout(StopSpec(), 3000) == 3000 // 30 + 25
    assert stop_timeout(StopSpec(), 131072) == 1800 and stop_timeout(StopSpec(), 100) == 30
    assert stop_timeout(StopSpec(), None) == 600


PLAYBOOK = "algo: ddtree\nspeculative_algorithm: DDTREE\n"


def test_playbook_bake_and_stop(tmp_path):
    p = tmp_path / "ddtree.yaml"
    p.write_text(PLAYBOOK + "bake: {duration: 60, interval: 5, max_error_rate: 0, min_accept_ratio: 0.8}\n"
                 "stop: {timeout: 120}\n")
    pb = load_playbook(p)
    assert pb.bake == BakeSpec(duration=60, interval=5, max_error_rate=0.0, min_accept_ratio=0.8)
    assert pb.stop.timeout == 120
    p.write_text(PLAYBOOK)
    assert load_playbook(p).bake is None and load_playbook(p).stop == StopSpec()


@pytest.mark.parametrize("extra, message", [
    ("bake: {interval: 600}", r"bake\.interval: expected a positive number of seconds, at most duration"),
    ("bake: {max_error_rate: 2}", r"bake\.max_error_rate: expected a number from 0.0 to 1.0"),
    ("bake: {max_p99_ratio: 0.5}", r"bake\.max_p99_ratio: expected a number >= 1.0"),
    ("bake: {colour: red}", r"bake\.colour: unknown key"),
    ("stop: {timeout: 0}", r"stop\.timeout: expected seconds from 1 to 86400"),
])
def test_playbook_bad_bake_or_stop_is_one_line(tmp_path, extra, message):
    p = tmp_path / "ddtree.yaml"
    p.write_text(PLAYBOOK + extra + "\n")
    with pytest.raises(ConfigError, match=message) as err:
        load_playbook(p)
    assert "\n" not in str(err.value) and str(p) in str(err.value)


ROUTED = """
routers:
  front: {admin_url: "http://router.example:30080", api_key: {secret_env: ROUTER_KEY}, min_serving: 1}
defaults: {vars: {router: front, api_port: 30000}}
hosts:
  ct129: {address: ct129.gpu.example}
  ct200: {address: ct200.gpu.example, vars: {api_port: 30001}}
"""


def test_inventory_router_per_fleet_and_worker_urls(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text(ROUTED)
    inv = load_inventory(p)
    spec = inv.router_of(inv.hosts["ct129"])
    assert spec is not None and spec.api_key_env == "ROUTER_KEY" and spec.min_serving == 1
    assert inv.worker_url(inv.hosts["ct129"]) == "http://ct129.gpu.example:30000"
    assert inv.worker_url(inv.hosts["ct200"]) == "http://ct200.gpu.example:30001"


@pytest.mark.parametrize("old, new, message", [
    ("router: front,", "router: back,", r"hosts\.ct129\.vars\.router: unknown router 'back' \(known: front\)"),
    ('"http://router.example:30080"', "router.example", r"routers\.front\.admin_url: expected an http\(s\) URL"),
    ("min_serving: 1", "min_serving: -1", r"routers\.front\.min_serving: expected 0 or more"),
    ("min_serving: 1", "worker_url: 'http://{host}:1'", r"routers\.front\.worker_url: expected a template"),
    ("min_serving: 1", "drain: 3", r"routers\.front\.drain: unknown key"),
])
def test_inventory_bad_router_is_one_line(tmp_path, old, new, message):
    p = tmp_path / "inv.yaml"
    p.write_text(ROUTED.replace(old, new))
    with pytest.raises(ConfigError, match=message) as err:
        load_inventory(p)
    assert "\n" not in str(err.value)


LABELS = '{model_name="/models/m",engine_type="unified"}'


def _with(text: str, name: str, value: str) -> str:
    """The captured scrape with `name`'s value replaced (a hostile or broken engine's)."""
    lines = [f"{name}{LABELS} {value}" if line.startswith(name + "{") else line for line in text.splitlines()]
    return "\n".join(lines) + "\n"


def _served(requests: float) -> str:
    return _with(CAPTURED, prometheus.REQUESTS, f"{requests}")


@pytest.mark.parametrize("name, value", [
    (prometheus.ACCEPT, "NaN"),                 # a gauge computed 0/0: every ratio with it is NaN
    (prometheus.ACCEPT, "+Inf"),
    (prometheus.ABORTED, "NaN"),                # a counter incremented by NaN: the error rate is NaN
    (prometheus.REQUESTS, "+Inf"),
])
def test_a_non_finite_figure_is_missing_and_fails_the_bake_closed(name, value):
    """Before the release: 4 requests; after: 104, of which the figure under test is not a number.
    Every comparison with NaN is false, so such a release used to pass."""
    before = _served(4.0)
    after = _with(_served(104.0), name, value)
    release = prometheus.figures(before, after)
    verdict = judge(BakeSpec(min_requests=20, max_p99_ratio=None), BASE, release)
    assert verdict.outcome != PASS and not verdict.ok, verdict
    assert any("not a finite" in r for r in verdict.reasons), verdict.reasons
    fine = judge(BakeSpec(min_requests=20, max_p99_ratio=None), BASE, prometheus.figures(before, _served(104.0)))
    assert fine.outcome == PASS, fine.reasons           # the same scrape with finite figures passes


def test_a_baseline_figure_that_is_not_finite_fails_the_bake_closed():
    base = prometheus.figures(_served(4.0), _with(_served(104.0), prometheus.ACCEPT, "NaN"))
    release = prometheus.figures(_served(4.0), _served(104.0))
    verdict = judge(BakeSpec(min_requests=20, max_p99_ratio=None), base, release)
    assert verdict.outcome == INCONCLUSIVE and any("baseline's" in r for r in verdict.reasons), verdict


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-3"])
def test_an_in_flight_gauge_that_is_not_a_count_is_unknown_never_an_exception(value):
    text = _with(CAPTURED, prometheus.RUNNING, value)
    assert prometheus.in_flight(text) is None


def test_the_parser_keeps_escaped_backslashes_and_reads_no_exemplar_as_a_value():
    """prometheus_client's own parser: `\\\\n` in a label is a backslash and an n, not a newline;
    an exemplar after `#` is not the sample's value."""
    text = ('sglang:num_requests_total{model_name="C:\\\\new"} 5\n'
            'sglang:e2e_request_latency_seconds_bucket{le="1.0"} 3 # {trace_id="abc"} 0.5\n'
            'sglang:e2e_request_latency_seconds_bucket{le="+Inf"} 3\n')
    samples = prometheus.parse(text)
    assert samples[0].label("model_name") == "C:\\new" and "\n" not in samples[0].label("model_name")
    assert prometheus.histogram(samples, prometheus.E2E) == {1.0: 3.0, float("inf"): 3.0}

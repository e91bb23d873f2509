"""The thin lab host's engine: SGLang's health and info routes with nothing imported but the stdlib.

Runs as `sglang.launch_server` when the unit sets FLEETSPEC_LAB_ENGINE=thin (hook.py): neither the
real `sglang` package, its parser, torch nor the decode model is imported, so a restart costs
~50 ms of CPU instead of ~10 s and 32 hosts fit on two cores. What a thin host therefore does not
catch at start: an unknown flag or a broken patch (the full stand-in's real parser and worker
dispatch do). The speculative algorithm is read off argv as the real parser would resolve it.
Start-time faults (crash_at_start, hang_at_start, slow_load) and health_503_after still bite, and
fail_requests_after (a release that degrades after N requests) and garbage_output (other tokens). /generate takes `thin_step_seconds`
per token (0 on lab hosts: thin hosts stay as fast as they were; the router's tests set it, so
requests are in flight for a while); SIGTERM drains them as sglang does (health 503, new
requests refused, in-flight ones finished, at most `drain_seconds`). /metrics (with
--enable-metrics) and /get_load are what the router and fleetspec's bake read.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fleetspec_lab_engine import settings
from fleetspec_lab_engine.metrics import Metrics

ALGO_FLAGS = ("--speculative-algorithm", "--speculative-algo")
ALIASES = {"NEXTN": "EAGLE"}   # as ServerArgs resolves it


def flag(argv: list[str], names: tuple[str, ...], default: str | None = None) -> str | None:
    """The value of the last of `names` in argv (`--x v` or `--x=v`)."""
    value = default
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


class Thin:
    def __init__(self, argv: list[str]):
        algo = flag(argv, ALGO_FLAGS)
        self.algorithm = ALIASES.get(algo.upper(), algo.upper()) if algo else None
        self.argv = argv
        self.model = flag(argv, ("--model-path",), "")
        self.up_since: float | None = None
        self.draining = False
        self.inflight = 0
        self.cond = threading.Condition()
        self.metrics = Metrics(self.model)
        self.enable_metrics = "--enable-metrics" in argv
        self.step_seconds = float(settings.engine()["thin_step_seconds"])

    def healthy(self) -> bool:
        after = settings.faults().get("health_503_after")
        return (self.up_since is not None and not self.draining
                and (after is None or time.monotonic() - self.up_since < float(after)))

    def admit(self) -> bool:
        with self.cond:
            if self.draining:
                return False
            self.inflight += 1
            return True

    def release(self) -> None:
        with self.cond:
            self.inflight -= 1
            self.cond.notify_all()

    def drain(self, seconds: float) -> None:
        with self.cond:
            self.draining = True
            deadline = time.monotonic() + seconds
            while self.inflight and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())

    def failing(self) -> bool:
        after = settings.faults().get("fail_requests_after")
        return after is not None and self.metrics.counts["sglang:num_requests_total"] >= float(after)

    def load(self) -> list[dict]:
        """0.5.13.post1's /get_load shape, which sglang-router 0.3.2 reads (0.5.23 serves /v1/loads)."""
        running = self.metrics.running
        return [{"dp_rank": 0, "num_reqs": running, "num_waiting_reqs": 0, "num_tokens": running,
                 "num_pending_tokens": 0, "ts_tic": time.perf_counter()}]

    def server_info(self) -> dict:
        served = settings.faults().get("wrong_algorithm") or self.algorithm
        return {"speculative_algorithm": served, "model_path": self.model, "version": "thin",
                "launch_command": " ".join(["python3", "-m", "sglang.launch_server", *self.argv]),
                "internal_states": [{"avg_spec_accept_length": None}],
                "lab_engine": {"thin": True}}

    def generate(self, body: dict) -> dict:
        n = int((body.get("sampling_params") or {}).get("max_new_tokens") or 8)
        ids = [(7 * i + len(str(body.get("text", "")))) % 64 for i in range(max(1, min(n, 64)))]
        if settings.faults().get("garbage_output"):     # a release whose greedy output changed
            ids = [(i * 13 + 5) % 64 for i in ids]
        started = time.monotonic()
        self.metrics.started()
        time.sleep(self.step_seconds * len(ids))
        accept = 2.0 if self.algorithm not in (None, "NONE") else None   # a stand-in figure
        self.metrics.finished(1, len(ids), time.monotonic() - started, accept, 0.5 if accept else None)
        return {"text": " ".join(f"w{i}" for i in ids), "output_ids": ids,
                "meta_info": {"completion_tokens": len(ids), "prompt_tokens": 1, "e2e_latency": 0.001,
                              "finish_reason": {"type": "length"}, "spec_accept_length": None,
                              "spec_verify_ct": len(ids)}}


def _text(h: BaseHTTPRequestHandler, text: str) -> None:
    data = text.encode()
    h.send_response(200)
    h.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _generate(h, thin: Thin, body: dict) -> None:
    if thin.failing():
        thin.metrics.aborted()
        h._send(500, {"error": {"message": "injected fault: fail_requests_after", "code": 500}})
    elif not thin.admit():
        h._send(503, {"error": {"message": "The server is shutting down", "code": 503}})
    else:
        try:
            h._send(200, thin.generate(body))
        finally:
            thin.release()


def handler(thin: Thin):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _send(self, status: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate", "/ready"):
                self._send(200 if thin.healthy() else 503, {})
            elif path == "/metrics" and thin.enable_metrics:
                _text(self, thin.metrics.render())
            elif path == "/get_load":
                self._send(200, thin.load())
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, thin.server_info())
            elif path in ("/model_info", "/v1/models"):
                self._send(200, {"model_path": thin.model, "data": [{"id": thin.model}]})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            if self.path.split("?")[0] == "/generate":
                _generate(self, thin, body)
            else:
                self._send(404, {"detail": "Not Found"})

    return Handler


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    thin = Thin(argv)
    settings.ALGORITHM = thin.algorithm
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    faults = settings.faults()
    print(f"fleetspec lab engine, thin (no sglang import); algorithm {thin.algorithm}; faults "
          f"{sorted(faults) or 'none'}", flush=True)
    if faults.get("crash_at_start"):
        print("RuntimeError: fleetspec-lab fault crash_at_start", flush=True)
        sys.exit(1)
    if settings.wait_stop(stop, float(faults.get("slow_load", settings.engine()["load_seconds"]))):
        sys.exit(0)
    if faults.get("hang_at_start"):
        settings.wait_stop(stop)
        sys.exit(0)
    host, port = flag(argv, ("--host",), "127.0.0.1"), int(flag(argv, ("--port",), "30000"))
    httpd = ThreadingHTTPServer((host, port), handler(thin))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    thin.up_since = time.monotonic()
    print(f"thin engine ready on {host}:{port}", flush=True)
    settings.wait_stop(stop)
    print(f"Received SIGTERM; draining {thin.inflight} in-flight request(s)", flush=True)
    thin.drain(float(settings.engine()["drain_seconds"]))
    httpd.shutdown()
    print("Shutdown complete", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()

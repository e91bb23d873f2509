"""SGLang's HTTP API (routes, status codes, JSON fields as in sglang 0.5.23's http_server.py),
served by the stdlib so it needs nothing beyond the host venv."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fleetspec_lab_engine import model, settings
from fleetspec_lab_engine.metrics import Metrics

DDTREE_MODULE = "sglang.srt.speculative.ddtree_utils"

OPEN_PATHS = {"/health", "/health_generate", "/ready", "/metrics"}  # open even with --api-key


class State:
    def __init__(self, parsed, engine, config):
        self.parsed, self.engine, self.config = parsed, engine, config
        self.status = "starting"       # starting | up | draining
        self.up_since = None
        self.startup_time = time.time()
        self.inflight = 0
        self.cond = threading.Condition()
        self.served_model_name = parsed.get("served_model_name") or parsed.get("model_path")
        self.metrics = Metrics(str(self.served_model_name))

    def healthy(self) -> bool:
        if self.status != "up":
            return False
        after = settings.faults().get("health_503_after")
        return after is None or time.monotonic() - self.up_since < float(after)


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    state: State = None

    def log_message(self, fmt, *args):
        pass

    # -- plumbing
    def _send(self, status: int, body=None, content_type="application/json"):
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _authorized(self, path: str) -> bool:
        key = self.state.parsed.get("api_key")
        if not key or path in OPEN_PATHS:
            return True
        return self.headers.get("authorization", "") == f"Bearer {key}"

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    do_PUT = do_POST

    def _route(self, method: str):
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            return self._send(401, {"error": "Unauthorized"})
        handler = ROUTES.get((method, path))
        if handler is None:
            if method == "GET" and path.startswith("/v1/models/"):
                return self._model_card(path[len("/v1/models/"):])
            return self._send(404, {"detail": "Not Found"})
        try:
            handler(self)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except ValueError as err:
            self._send(400, {"error": {"message": str(err), "type": "invalid_request_error", "code": 400}})

    # -- routes
    def ready(self):
        self._send(200 if self.state.status == "up" else 503)

    def health(self):
        self._send(200 if self.state.healthy() else 503)

    def server_info(self):
        s = self.state
        info = dict(s.parsed.values)
        wrong = settings.faults().get("wrong_algorithm")
        if wrong:
            info["speculative_algorithm"] = wrong
        info["launch_command"] = " ".join(s.parsed.argv)
        internal = {"last_gen_throughput": round(s.engine.stats["last_throughput"], 3),
                    "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": 0, "graph": 0.0}}
        accept = s.engine.accept_length()
        if s.engine.algorithm != "NONE":
            internal["avg_spec_accept_length"] = accept if accept is not None else 0.0
        info.update({"startup_time": s.startup_time, "internal_states": [internal],
                     "version": s.parsed.version, "frontend": "python"})
        # Not in a real server's answer: what the stand-in decoded with (fleetspec reads nothing
        # from it; lab tests and operators of the lab do).
        with s.engine.lock:
            counts = {k: s.engine.stats[k] for k in ("verify_ct", "trees_built", "accepted_tokens",
                                                     "generation_tokens", "steps_without_graph")}
            counts["graph_size"] = s.engine.graph_size
            counts["steps_by_mode"] = dict(s.engine.stats["steps_by_mode"])
        info["lab_engine"] = {**s.engine.plan.as_dict(), **counts, "imported": list(s.parsed.imported)}
        info.update(ddtree_kernel_info(s.engine.decoder.du))
        self._send(200, info)

    def model_info(self):
        p = self.state.parsed
        self._send(200, {
            "model_path": p.get("model_path"), "served_model_name": self.state.served_model_name,
            "tokenizer_path": p.get("tokenizer_path") or p.get("model_path"), "is_generation": True,
            "preferred_sampling_params": None, "weight_version": p.get("weight_version", "default"),
            "load_format": p.get("load_format"), "reasoning_parser": p.get("reasoning_parser"),
            "tool_call_parser": p.get("tool_call_parser"), "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": None, "architectures": None})

    def models(self):
        self._send(200, {"object": "list", "data": [self._card(self.state.served_model_name)]})

    def _card(self, name):
        return {"id": name, "object": "model", "created": int(self.state.startup_time),
                "owned_by": "sglang", "root": name, "parent": None,
                "max_model_len": self.state.parsed.get("context_length")}

    def _model_card(self, name):
        if name != self.state.served_model_name:
            return self._send(404, {"error": {"message": f"The model '{name}' does not exist",
                                              "type": "invalid_request_error", "param": "model",
                                              "code": "model_not_found"}})
        self._send(200, self._card(name))

    def metrics(self):
        if not self.state.parsed.get("enable_metrics"):
            return self._send(404, {"detail": "Not Found"})
        self._send(200, self.state.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")

    def get_load(self):
        """0.5.13.post1's /get_load (0.5.23 has only /v1/loads): sglang-router 0.3.2 reads it."""
        if self.state.parsed.version.startswith("0.5.23"):
            return self._send(404, {"detail": "Not Found"})
        running = self.state.metrics.running
        self._send(200, [{"dp_rank": 0, "num_reqs": running, "num_waiting_reqs": 0, "num_tokens": running,
                          "num_pending_tokens": 0, "ts_tic": time.perf_counter()}])

    # -- generation
    def _admit(self) -> bool:
        s = self.state
        with s.cond:
            if s.status != "up":
                self._send(503, {"error": {"message": "The server is not ready" if s.status == "starting"
                                           else "The server is shutting down", "code": 503}})
                return False
            s.inflight += 1
            return True

    def _release(self):
        with self.state.cond:
            self.state.inflight -= 1
            self.state.cond.notify_all()

    def _run(self, prompt_ids, params, on_step=None):
        max_new = int(params.get("max_new_tokens", 128))
        temperature = float(params.get("temperature", 1.0))
        metrics = self.state.metrics
        metrics.started()
        try:
            result = self.state.engine.generate(prompt_ids, max_new, temperature, on_step, params.get("sampling_seed"))
        except BaseException:
            metrics.aborted(was_running=True)
            raise
        verify_ct, proposed = result.get("verify_ct") or 0, max(1, result.get("proposed") or 0)
        spec = self.state.engine.algorithm != "NONE" and verify_ct
        metrics.finished(len(prompt_ids), len(result["ids"]), result["elapsed"],
                         len(result["ids"]) / verify_ct if spec else None,
                         (result.get("accepted") or 0) / proposed if spec else None)
        return result

    def _meta(self, rid, prompt_ids, ids, result, elapsed, finished: bool, max_new: int):
        meta = {"id": rid, "finish_reason": {"type": "length", "length": max_new} if finished else None,
                "prompt_tokens": len(prompt_ids), "weight_version": "default", "num_retractions": 0,
                "reasoning_tokens": 0, "completion_tokens": len(ids), "cached_tokens": 0,
                "e2e_latency": elapsed}
        verify_ct = result.get("verify_ct", 0)
        if self.state.engine.algorithm != "NONE" and verify_ct:
            proposed = max(1, result.get("proposed", 0))
            accepted = result.get("accepted", 0)
            meta.update({"spec_accept_rate": accepted / proposed,
                         "spec_accept_length": len(ids) / verify_ct,
                         "spec_num_correct_drafts": accepted,
                         "spec_num_proposed_drafts": proposed, "spec_verify_ct": verify_ct})
        return meta

    def generate(self):
        body = self._body()
        params = body.get("sampling_params") or {}
        if "input_ids" in body and body["input_ids"] is not None:
            prompt_ids = [int(t) % self.state.engine.size for t in body["input_ids"]]
        elif isinstance(body.get("text"), str):
            prompt_ids = model.tokenize(body["text"], self.state.engine.size)
        else:
            raise ValueError("Either text or input_ids should be provided.")
        after = settings.faults().get("fail_requests_after")
        if after is not None and self.state.engine.stats["requests"] >= float(after):
            self.state.metrics.aborted()
            return self._send(500, {"error": {"message": "injected fault: fail_requests_after", "code": 500}})
        if not self._admit():
            return
        rid = body.get("rid") or uuid.uuid4().hex
        max_new = int(params.get("max_new_tokens", 128))
        started = time.monotonic()
        try:
            if body.get("stream"):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True

                def chunk(ids, ct):
                    out = {"text": model.detokenize(ids, self.state.engine.size), "output_ids": list(ids),
                           "meta_info": self._meta(rid, prompt_ids, ids, {"verify_ct": ct},
                                                   time.monotonic() - started, len(ids) >= max_new, max_new)}
                    self.wfile.write(b"data: " + json.dumps(out).encode() + b"\n\n")
                    self.wfile.flush()

                result = self._run(prompt_ids, params, chunk)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                return
            result = self._run(prompt_ids, params)
            ids = result["ids"]
            self._send(200, {"text": model.detokenize(ids, self.state.engine.size), "output_ids": ids,
                             "meta_info": self._meta(rid, prompt_ids, ids, result, result["elapsed"],
                                                     True, max_new)})
        finally:
            self._release()

    def chat(self):
        body = self._body()
        messages = body.get("messages") or []
        prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        prompt_ids = model.tokenize(prompt, self.state.engine.size)
        max_new = int(body.get("max_tokens") or body.get("max_completion_tokens") or 128)
        params = {"max_new_tokens": max_new, "temperature": body.get("temperature", 1.0),
                  "sampling_seed": body.get("seed")}
        if not self._admit():
            return
        try:
            result = self._run(prompt_ids, params)
        finally:
            self._release()
        ids = result["ids"]
        self._send(200, {
            "id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or self.state.served_model_name,
            "choices": [{"index": 0, "message": {"role": "assistant",
                                                 "content": model.detokenize(ids, self.state.engine.size),
                                                 "reasoning_content": None, "tool_calls": None},
                         "logprobs": None, "finish_reason": "length", "matched_stop": None}],
            "usage": {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + len(ids),
                      "completion_tokens": len(ids), "prompt_tokens_details": None,
                      "reasoning_tokens": 0},
            "metadata": {"weight_version": "default"}})


ROUTES = {
    ("GET", "/ready"): Handler.ready,
    ("GET", "/health"): Handler.health,
    ("GET", "/health_generate"): Handler.health,
    ("GET", "/server_info"): Handler.server_info,
    ("GET", "/get_server_info"): Handler.server_info,
    ("GET", "/model_info"): Handler.model_info,
    ("GET", "/get_model_info"): Handler.model_info,
    ("GET", "/v1/models"): Handler.models,
    ("GET", "/metrics"): Handler.metrics,
    ("GET", "/get_load"): Handler.get_load,
    ("POST", "/generate"): Handler.generate,
    ("POST", "/v1/chat/completions"): Handler.chat,
}


def ddtree_kernel_info(du=None) -> dict:
    """{"ddtree_kernel": ...}: the deployed payload's candidates path (kernel and library, or the
    torch fallback and why) once sglang has imported it; {} before. Real sglang has no such field
    (DEVELOPING.md says why); its engine log has the payload's one line."""
    du = du or sys.modules.get(DDTREE_MODULE)
    if du is None or not hasattr(du, "kernel_status"):
        return {}
    line = du.kernel_line() if hasattr(du, "kernel_line") else None
    return {"ddtree_kernel": {**du.kernel_status(), "line": line}}


def serve(state: State, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": state})
    httpd = ThreadingHTTPServer((host, port), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    return httpd

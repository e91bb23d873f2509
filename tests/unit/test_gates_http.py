"""Gates fail closed (issue 13, item 8): measured over the real SSH transport (a direct-tcpip
channel through a loopback sshd) against a real HTTP server that answers some /generate calls
with errors, with fields missing, or with outputs longer than the baseline's."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from fleetspec.model.inventory import load_inventory
from fleetspec.model.playbook import AcceptanceGate, Gates, ParityGate, ThroughputGate, load_playbook_for
from fleetspec.ops import gates, probes
from fleetspec.ops.gates import FAIL, GOLDEN_PROMPTS, INCONCLUSIVE, PASS, judge
from fleetspec.remote.transport import Transport

ROOT = Path(__file__).resolve().parents[2]
IDS = {p: [10 + i, 20 + i, 30 + i, 40 + i] for i, p in enumerate(GOLDEN_PROMPTS)}


def answer(prompt, ids=None, accept=3.0, **drop):
    ids = IDS[prompt] if ids is None else ids
    body = {"text": "x", "output_ids": ids,
            "meta_info": {"completion_tokens": len(ids), "spec_accept_length": accept}}
    for key in drop:
        body.pop(key, None) if key in body else body["meta_info"].pop(key, None)
    return 200, body


class Server:
    """Answers POST /generate with `self.reply(prompt) -> (status, json body)`."""

    def __init__(self):
        self.reply = answer
        self.auth = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = req["text"].split(" (#")[0]
                outer.auth.append(self.headers.get("Authorization"))
                status, body = outer.reply(prompt)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def t(sshd, ssh_client_key, inventory_writer, tmp_path_factory):
    inv = load_inventory(inventory_writer(tmp_path_factory.mktemp("inv") / "inv.yaml", {"h": sshd}, ssh_client_key))
    t = Transport(inv.hosts["h"])
    yield t
    t.close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def measure(t, server, reply, **kw):
    server.reply = reply
    return gates.measure(t, server.port, **kw)


def one(gate_set, before, after, name):
    return {v.name: v for v in judge(gate_set, before, after, hybrid=False)}[name]


FAILING = set(GOLDEN_PROMPTS[:3])


def test_acceptance_is_inconclusive_when_some_answers_failed(t, server):
    """Five good answers out of eight used to be enough to pass."""
    after = measure(t, server, lambda p: (500, {"error": "boom"}) if p in FAILING else answer(p))
    assert len(after.errors) == 3 and len(after.accept_lengths) == 5
    v = one(Gates(acceptance=AcceptanceGate(min=2.0)), None, after, "acceptance")
    assert v.verdict == INCONCLUSIVE and v.blocks and "3 failed or malformed" in v.reason
    dry = one(Gates(acceptance=AcceptanceGate(min=2.0, dry_run=True)), None, after, "acceptance")
    assert dry.verdict == INCONCLUSIVE and not dry.blocks
    good = measure(t, server, answer)
    assert one(Gates(acceptance=AcceptanceGate(min=2.0)), None, good, "acceptance").verdict == PASS


def test_acceptance_is_inconclusive_when_an_answer_lacks_its_accept_length(t, server):
    after = measure(t, server, lambda p: answer(p, spec_accept_length=None) if p in FAILING else answer(p))
    v = one(Gates(acceptance=AcceptanceGate(min=2.0)), None, after, "acceptance")
    assert v.verdict == INCONCLUSIVE and "3 of 8 answers carried no spec_accept_length" in v.reason


def test_parity_is_inconclusive_when_some_release_answers_failed(t, server):
    before = measure(t, server, answer)
    after = measure(t, server, lambda p: (503, {}) if p in FAILING else answer(p))
    v = one(Gates(parity=ParityGate()), before, after, "parity")
    assert v.verdict == INCONCLUSIVE and v.blocks and "release: 3 failed" in v.reason


def test_missing_output_ids_are_malformed_not_empty_lists(t, server):
    """Baseline and release both without output_ids used to compare [] == [] and pass."""
    before = measure(t, server, lambda p: answer(p, output_ids=None))
    after = measure(t, server, lambda p: answer(p, output_ids=None))
    assert not before.outputs and len(before.prompt_errors) == 8
    assert "output_ids" in before.prompt_errors[0]
    v = one(Gates(parity=ParityGate()), before, after, "parity")
    assert v.verdict == INCONCLUSIVE and v.blocks


@pytest.mark.parametrize("bad", [["1", "2"], [1.5], "12", None])
def test_output_ids_that_are_not_token_ids_are_malformed(t, server, bad):
    m = measure(t, server, lambda p: answer(p, ids=bad) if bad is not None else answer(p, completion_tokens=None))
    assert len(m.prompt_errors) == 8 and "malformed" in m.prompt_errors[0]


def test_a_release_whose_output_runs_past_the_baseline_fails_parity(t, server):
    before = measure(t, server, answer)
    longer = GOLDEN_PROMPTS[4]
    after = measure(t, server, lambda p: answer(p, ids=IDS[p] + [99, 98]) if p == longer else answer(p))
    v = one(Gates(parity=ParityGate()), before, after, "parity")
    assert v.verdict == FAIL and v.figures["first_difference"] == {"prompt": longer, "token_index": 4,
                                                                   "baseline": None, "release": 99}
    assert one(Gates(parity=ParityGate()), before, measure(t, server, answer), "parity").verdict == PASS


def test_throughput_counts_malformed_load_answers_as_errors(t, server):
    g = Gates(throughput=ThroughputGate(min_ratio=0.5, concurrency=(2,), requests=4))
    before = measure(t, server, answer, prompts=(), concurrency=(2,), requests=4, rounds=1)
    after = measure(t, server, lambda p: answer(p, completion_tokens=None), prompts=(), concurrency=(2,),
                    requests=4, rounds=1)
    assert len(after.errors) == 4
    assert one(g, before, after, "throughput").verdict == INCONCLUSIVE


def test_a_level_above_the_request_count_sends_as_many_requests_as_the_level(t, server):
    """16 requests at concurrency 16, where the gate asks for 4: the level is really reached."""
    before = len(server.auth)
    m = measure(t, server, answer, prompts=(), concurrency=(16,), requests=4, rounds=1)
    assert len(server.auth) - before == 16 and not m.errors and m.tokens_per_s[16] > 0


@pytest.mark.parametrize("algo", ["ddtree", "dflash", "nextn"])
def test_every_algo_changing_playbook_has_a_gate_that_counts_request_errors(t, server, algo):
    """dflash and nextn have no throughput gate: their acceptance gate counts the errors."""
    playbook = load_playbook_for(ROOT, algo)
    before = measure(t, server, answer)
    after = measure(t, server, lambda p: (500, {}) if p == GOLDEN_PROMPTS[0] else answer(p))
    verdicts = judge(playbook.gates, before, after, hybrid=False)
    assert any(v.name in ("acceptance", "throughput") and not v.dry_run and v.blocks and "1 failed" in v.reason
               for v in verdicts), verdicts


def test_gates_and_probes_send_the_same_bearer_header_and_none_without_a_key(t, server):
    """One /generate client (remote/sglang_api.py) serves both; the key travels as a Bearer header."""
    measure(t, server, answer, prompts=GOLDEN_PROMPTS[:1], api_key="k-1")
    spec = probes.ProbeSpec(port=server.port, expected_algorithm=None, api_key="k-1")
    assert probes.generate(t, spec, GOLDEN_PROMPTS[0], 4)["output_ids"] == IDS[GOLDEN_PROMPTS[0]]
    measure(t, server, answer, prompts=GOLDEN_PROMPTS[:1])
    assert server.auth == ["Bearer k-1", "Bearer k-1", None]


@pytest.mark.parametrize("reply, error", [((500, {"error": "boom"}), "HTTP 500"), ((200, b"<html>"), "not JSON")])
def test_a_probe_generate_that_fails_is_an_answer_not_an_exception(t, server, reply, error):
    server.reply = lambda p: reply
    got = probes.generate(t, probes.ProbeSpec(port=server.port, expected_algorithm=None), "x", 4)
    assert got["ok"] is False and error in got["error"]
    m = measure(t, server, lambda p: reply, prompts=GOLDEN_PROMPTS[:1])
    assert len(m.prompt_errors) == 1 and error in m.prompt_errors[0]


def test_empty_or_short_output_ids_for_a_non_empty_completion_are_failed_requests(t, server):
    """Both sides answering `output_ids: []` with completion_tokens 3 and differing texts used to
    pass parity and acceptance: [] == []."""
    def empty(text):
        return lambda p: (200, {"text": text, "output_ids": [],
                                "meta_info": {"completion_tokens": 3, "spec_accept_length": 3.0}})
    before, after = measure(t, server, empty("Paris is")), measure(t, server, empty("London is"))
    assert not after.outputs and len(after.prompt_errors) == 8
    assert "0 output_ids for meta_info.completion_tokens 3" in after.prompt_errors[0]
    g = Gates(acceptance=AcceptanceGate(min=2.0), parity=ParityGate())
    assert {v.name: v.verdict for v in judge(g, before, after, hybrid=False)} == {
        "acceptance": INCONCLUSIVE, "parity": INCONCLUSIVE}
    short = measure(t, server, lambda p: (200, {"text": "x", "output_ids": IDS[p][:2],
                                                "meta_info": {"completion_tokens": 4}})
                    if p == GOLDEN_PROMPTS[1] else answer(p))
    assert len(short.prompt_errors) == 1 and "2 output_ids for meta_info.completion_tokens 4" in short.errors[0]


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), -1.0])
def test_an_accept_length_that_is_infinite_or_negative_is_a_malformed_answer(t, server, bad):
    """`Infinity` (what Python's JSON writes for inf) in one answer made the mean infinite and
    passed a gate whose other answers were all below the floor; a negative one is no length."""
    after = measure(t, server, lambda p: answer(p, accept=bad) if p == GOLDEN_PROMPTS[0] else answer(p, accept=1.0))
    assert len(after.prompt_errors) == 1 and "spec_accept_length" in after.prompt_errors[0]
    assert all(x == 1.0 for x in after.accept_lengths)
    v = one(Gates(acceptance=AcceptanceGate(min=2.0)), None, after, "acceptance")
    assert v.verdict == INCONCLUSIVE and v.blocks

"""`fleetspec gate` between two real HTTP engines (the lab's thin stand-in on loopback ports), run
as the CLI in a child process: the JSON it prints and its exit codes (0 pass, 1 fail, 3
inconclusive, 2 bad input), the recorded baseline, and the bake over both sides' /metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "fleetspec" / "lab" / "engine"
GATES = ("gates:\n  acceptance: {min: 2.0, dry_run: true}\n"
         "  throughput: {concurrency: [1, 2], requests: 4}\n"
         "  parity: {max_new_tokens: 16}\n")
BAKE = "bake: {duration: 1, interval: 0.5, min_requests: 1, max_p99_ratio: null}\n"
KEYS = {"verdict", "exit_code", "reasons", "algo", "playbook", "expected_algorithm", "gates", "baseline",
        "candidate", "bake"}


class Engine:
    """The thin stand-in on a loopback port, with its own settings folder (faults.json)."""

    def __init__(self, tmp: Path, algorithm: str, faults: dict | None = None):
        self.etc = tmp / f"etc-{algorithm}-{id(self)}"
        self.etc.mkdir()
        (self.etc / "engine.json").write_text(json.dumps({"load_seconds": 0, "thin_step_seconds": 0.001}))
        if faults:
            (self.etc / "faults.json").write_text(json.dumps(faults))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ENGINE), "FLEETSPEC_LAB_ETC": str(self.etc)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetspec_lab_engine.thin", "--model-path", "/models/m", "--host", "127.0.0.1",
             "--port", str(self.port), "--enable-metrics", "--speculative-algorithm", algorithm],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert "ready on" in self.proc.stdout.readline() + self.proc.stdout.readline()   # its own word

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture
def engines(tmp_path):
    made: list[Engine] = []
    yield lambda algorithm, **kw: made.append(Engine(tmp_path, algorithm, **kw)) or made[-1]
    for e in made:
        if e.proc.poll() is None:
            e.proc.kill()
            e.proc.wait()


def playbook(tmp: Path, extra: str = "") -> Path:
    """A copy of the ddtree playbook with small gates (the thin engine reports no accept length,
    so acceptance is a dry run here; the lab test runs it for real)."""
    folder = tmp / "playbooks"
    folder.mkdir(exist_ok=True)
    (folder / "ddtree").symlink_to(REPO / "playbooks" / "ddtree")
    text = (REPO / "playbooks" / "ddtree.yaml").read_text().split("\ngates:\n")[0]
    path = folder / "ddtree.yaml"
    path.write_text(text + "\n" + GATES + extra)
    return path


def gate(*args) -> tuple[int, dict, str]:
    r = subprocess.run([sys.executable, "-m", "fleetspec", "gate", "--quiet", *args], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    out = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
    return r.returncode, out, r.stderr


def test_a_good_candidate_passes_with_every_figure_in_the_json(engines, tmp_path):
    old, new = engines("DFLASH"), engines("DDTREE")
    rc, out, err = gate("--baseline", old.url, "--candidate", new.url, "--playbook", str(playbook(tmp_path)))
    assert rc == 0, (out, err)
    assert set(out) == KEYS and out["verdict"] == "pass" and out["exit_code"] == 0 and out["reasons"] == []
    by = {g["name"]: g for g in out["gates"]}
    assert set(by) == {"acceptance", "throughput", "parity"}
    assert by["parity"]["verdict"] == "pass" and by["parity"]["figures"]["prompts_compared"] == 8
    assert by["throughput"]["verdict"] == "pass"
    assert {"tok_s_c1", "baseline_tok_s_c2", "ratio_c2"} <= set(by["throughput"]["figures"])
    # the thin engine reports no accept length: acceptance is inconclusive, a dry run, not blocking
    assert by["acceptance"]["verdict"] == "inconclusive" and by["acceptance"]["blocks"] is False
    assert out["candidate"]["speculative_algorithm"] == "DDTREE" and out["candidate"]["url"] == new.url
    assert out["baseline"]["figures"]["requests_failed"] == 0 and out["bake"] is None


def test_changed_greedy_output_fails_with_exit_1(engines, tmp_path):
    old, new = engines("DFLASH"), engines("DDTREE", faults={"garbage_output": True})
    rc, out, _ = gate("--baseline", old.url, "--candidate", new.url, "--playbook", str(playbook(tmp_path)),
                      "--concurrency", "1")
    assert rc == 1 and out["verdict"] == "fail", out
    parity = next(g for g in out["gates"] if g["name"] == "parity")
    assert parity["verdict"] == "fail" and "greedy output differs at token 0" in parity["reason"]
    assert any(r.startswith("parity: fail") for r in out["reasons"])
    throughput = next(g for g in out["gates"] if g["name"] == "throughput")
    assert set(throughput["figures"]) == {"tok_s_c1", "baseline_tok_s_c1", "ratio_c1"}   # --concurrency's levels


def test_a_candidate_serving_another_algorithm_fails(engines, tmp_path):
    old, new = engines("DFLASH"), engines("DFLASH")
    rc, out, _ = gate("--baseline", old.url, "--candidate", new.url, "--playbook", str(playbook(tmp_path)))
    assert rc == 1 and "the candidate serves DFLASH, expected DDTREE" in out["reasons"], out


def test_an_endpoint_not_answering_is_inconclusive_exit_3(engines, tmp_path):
    old = engines("DFLASH")
    dead = f"http://127.0.0.1:{free_port()}"
    rc, out, _ = gate("--baseline", old.url, "--candidate", dead, "--playbook", str(playbook(tmp_path)))
    assert rc == 3 and out["verdict"] == "inconclusive" and out["exit_code"] == 3, out
    assert out["reasons"] == [f"candidate not answering: {dead}/health: connection refused"]
    assert set(out) == KEYS and out["gates"] == []


def test_failed_requests_make_the_gates_inconclusive(engines, tmp_path):
    old, new = engines("DFLASH"), engines("DDTREE", faults={"fail_requests_after": 3})
    rc, out, _ = gate("--baseline", old.url, "--candidate", new.url, "--playbook", str(playbook(tmp_path)))
    assert rc == 3 and out["verdict"] == "inconclusive", out
    assert {g["name"]: g["verdict"] for g in out["gates"]}["parity"] == "inconclusive"


def test_a_recorded_baseline_judges_the_same_endpoint_after_its_change(engines, tmp_path):
    pb = str(playbook(tmp_path))
    old = engines("DFLASH")
    rc, out, err = gate("--baseline", old.url, "--record", str(tmp_path / "base.json"), "--playbook", pb)
    assert rc == 0 and out["figures"]["requests_failed"] == 0, err
    old.stop()                                    # the one group is replaced by the candidate
    new = engines("DDTREE")
    rc, out, _ = gate("--baseline", str(tmp_path / "base.json"), "--candidate", new.url, "--playbook", pb)
    assert rc == 0 and out["baseline"] == {"recorded": True, "figures": out["baseline"]["figures"]}, out
    bad = engines("DDTREE", faults={"garbage_output": True})
    rc, out, _ = gate("--baseline", str(tmp_path / "base.json"), "--candidate", bad.url, "--playbook", pb)
    assert rc == 1 and out["verdict"] == "fail", out


def test_the_bake_compares_both_sides_metrics_over_one_window(engines, tmp_path):
    old, new = engines("DFLASH"), engines("DDTREE", faults={"fail_requests_after": 40})
    pb = str(playbook(tmp_path, BAKE))
    ok = urllib.request.urlopen(new.url + "/metrics", timeout=5).read()
    assert b"sglang:num_requests_total" in ok
    rc, out, _ = gate("--baseline", old.url, "--candidate", new.url, "--playbook", pb, "--bake",
                      "--concurrency", "1")
    # the gates' own requests (8 + 2 x 4 per side) stay under 40: they pass; nothing else is sent in
    # the bake's window, so its verdict is min_requests': inconclusive
    assert out["bake"]["outcome"] == "inconclusive" and rc == 3, out
    assert "fewer than min_requests 1" in out["bake"]["reasons"][0]


@pytest.mark.parametrize("args,message", [
    (["--baseline", "ftp://x", "--candidate", "http://127.0.0.1:1", "--algo", "ddtree"], "expected http://HOST"),
    (["--baseline", "http://127.0.0.1:1", "--candidate", "http://127.0.0.1:1", "--algo", "nope"], "unknown algo"),
    (["--baseline", "http://127.0.0.1:1", "--algo", "ddtree"], "--candidate URL is required"),
    (["--baseline", "/nonexistent.json", "--candidate", "http://127.0.0.1:1", "--algo", "ddtree"],
     "cannot read the recorded baseline"),
    (["--baseline", "http://127.0.0.1:1", "--candidate", "http://127.0.0.1:1", "--algo", "ddtree", "--bake"],
     "has no bake: section"),
    (["--baseline", "http://127.0.0.1:1", "--candidate", "http://127.0.0.1:1", "--algo", "ddtree",
      "--concurrency", "0"], "expected positive whole numbers"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(REPO), "gate", *args],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_gate_needs_no_fleet_root_with_a_playbook_file(tmp_path, engines):
    """Run from anywhere (a Job's image): --playbook needs no inventory and no fleet root."""
    old, new = engines("DFLASH"), engines("DDTREE")
    pb = playbook(tmp_path)
    r = subprocess.run([sys.executable, "-m", "fleetspec", "gate", "--quiet", "--baseline", old.url,
                        "--candidate", new.url, "--playbook", str(pb)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr


def test_a_baseline_with_failed_requests_is_not_recorded(engines, tmp_path):
    old = engines("DFLASH", faults={"fail_requests_after": 2})
    rc, out, _ = gate("--baseline", old.url, "--record", str(tmp_path / "base.json"),
                      "--playbook", str(playbook(tmp_path)))
    assert rc == 3 and out["verdict"] == "inconclusive" and not (tmp_path / "base.json").exists(), out
    assert "of the baseline's requests failed" in out["reasons"][0]


class Endless:
    """A real HTTP server on loopback whose /health body never ends (or that records headers)."""

    def __init__(self):
        import http.server
        import threading

        self.auth: list = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.auth.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.end_headers()
                if self.path == "/health":
                    try:
                        while True:
                            self.wfile.write(b"x" * 65536)
                    except OSError:
                        return

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_endless_answer_is_capped_and_the_api_key_travels_only_in_its_header(engines, tmp_path):
    """The direct client reads at most 16 MiB of an answer (remote/limits.py), as over SSH; the API
    key comes from an environment variable (never argv, which `ps` and a Job's manifest show), goes
    as a Bearer header and is printed nowhere."""
    server, old = Endless(), engines("DFLASH")
    try:
        r = subprocess.run([sys.executable, "-m", "fleetspec", "gate", "--quiet", "--baseline", old.url, "--candidate",
                            server.url, "--playbook", str(playbook(tmp_path)), "--api-key-env", "GATE_KEY"],
                           capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "GATE_KEY": "s3cr3t"})
    finally:
        server.close()
    out = json.loads(r.stdout)
    assert r.returncode == 3 and out["reasons"][0].startswith(f"candidate not answering: {server.url}/health: the "
                                                              f"answer runs past 16 MiB"), out
    assert server.auth == ["Bearer s3cr3t"] and "s3cr3t" not in r.stdout + r.stderr

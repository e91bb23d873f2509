"""Thin lab hosts (issue 17): the profile, and the engine that answers without importing sglang."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from bench import scaling
from fleetspec.lab import engine, inventory, profiles


def test_tn_names_are_thin_ct200_shapes():
    thin, ct200 = profiles.for_host("tn7"), profiles.for_host("ct200")
    assert thin.like == "thin" and profiles.for_host("tnx").like == "ct200"
    assert (thin.version, thin.argv, thin.model_path) == (ct200.version, ct200.argv, ct200.model_path)
    unit = profiles.unit_text(thin)
    assert "Environment=FLEETSPEC_LAB_ENGINE=thin\n" in unit
    assert unit.replace("Environment=FLEETSPEC_LAB_ENGINE=thin\n", "") == profiles.unit_text(ct200)
    data = yaml.safe_load(inventory.render({"tn1": "10.200.0.10", "ct200": "10.200.0.200"}))
    assert data["groups"]["thin"] == ["tn1"]
    assert data["hosts"]["tn1"]["vars"]["python"] == "/opt/sglang/venv/bin/python3"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path, port: int, faults: dict | None = None) -> subprocess.Popen:
    """`python -m sglang.launch_server` as a thin host's unit runs it: the lab's .pth in a site
    folder, FLEETSPEC_LAB_ENGINE=thin, and a `sglang` on the path that fails when imported."""
    site = tmp_path / "site"
    for rel, data in engine.files().items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    (tmp_path / "real" / "sglang").mkdir(parents=True, exist_ok=True)
    (tmp_path / "real" / "sglang" / "__init__.py").write_text("raise SystemExit('the real sglang was imported')\n")
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "engine.json").write_text(json.dumps({"load_seconds": 0.1}))
    (etc / "faults.json").write_text(json.dumps(faults or {}))
    code = textwrap.dedent(f"""
        import runpy, site, sys
        site.addsitedir({str(site)!r})
        sys.argv = ["launch_server", "--port", "{port}", "--host", "127.0.0.1", "--speculative-algo", "NEXTN"]
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "real"), "FLEETSPEC_LAB_ENGINE": "thin",
           "FLEETSPEC_LAB_ETC": str(etc)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _get(port: int, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", data=data, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, None


def test_thin_engine_serves_the_probed_routes_without_sglang(tmp_path):
    port = _free_port()
    proc = _start(tmp_path, port)
    try:
        deadline = time.monotonic() + 20
        seen = []
        while not seen or seen[-1] != 200:     # 503 while it loads (load_seconds), then 200
            try:
                seen.append(_get(port, "/health")[0])
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (seen, proc.stdout.read())
            time.sleep(0.05)
        assert set(seen) <= {503, 200}, seen
        _, info = _get(port, "/server_info")
        assert info["speculative_algorithm"] == "EAGLE" and "--speculative-algo NEXTN" in info["launch_command"]
        _, gen = _get(port, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 5}})
        assert gen["text"] and gen["meta_info"]["completion_tokens"] == 5
        assert _get(port, "/nope")[0] == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_thin_engine_crash_at_start_exits_1(tmp_path):
    proc = _start(tmp_path, _free_port(), {"crash_at_start": True})
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 1 and "crash_at_start" in out


def test_fit_and_extrapolation():
    a, c = scaling.fit([(1, 3.5), (2, 4.0), (4, 5.0), (8, 7.0)])
    assert a == pytest.approx(3.0) and c == pytest.approx(0.5)
    assert scaling.fit([(4, 2.0), (4, 4.0)]) == (3.0, 0.0)
    rows = scaling.plan(load=7.0, one=5.0, p=0.2, q=0.4, total=500)
    p8, p16 = rows[0], rows[1]
    assert (p8["parallel"], p8["batches"], p8["batch_s"]) == (8, 63, 12.0)   # 0.2 + 0.4·8 < 5: one host's
    assert p16["batch_s"] == pytest.approx(7.0 + 0.2 + 6.4) and p16["own_x_one"] == pytest.approx(6.6 / 5)
    assert scaling.knee(5.0, 0.2, 0.4) == pytest.approx(12.0)


def test_inotify_limit_is_raised_for_many_hosts_never_lowered(tmp_path, monkeypatch):
    from fleetspec.lab import lab

    limit = tmp_path / "max_user_instances"
    monkeypatch.setattr(lab, "INOTIFY", limit)
    said = []
    limit.write_text("128\n")
    lab.ensure_inotify(32, said.append)
    assert limit.read_text() == f"{128 + 32 * lab.INOTIFY_PER_HOST}\n" and "128 -> 384" in said[0]
    limit.write_text("1000\n")
    lab.ensure_inotify(32, said.append)
    assert limit.read_text() == "1000\n" and len(said) == 1

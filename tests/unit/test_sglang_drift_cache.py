"""The sglang RECORD check, run by a real python on a real (small) installed distribution:
drift is found, and the stat-keyed cache skips rehashing only files nobody wrote since."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys

from fleetspec.remote.facts import sglang as fact


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_dist(site):
    files = {"sglang/__init__.py": b"__version__ = '0.5.23'\n", "sglang/srt/server_args.py": b"X = 1\n"}
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    info = site / "sglang-0.5.23.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    (info / "RECORD").write_text("".join(f"{rel},{record_hash(d)},{len(d)}\n" for rel, d in files.items())
                                 + "sglang-0.5.23.dist-info/RECORD,,\n")


def run(site, cache):
    env = {**os.environ, "PYTHONPATH": str(site), "FLEETSPEC_FACT_CACHE": str(cache)}
    r = subprocess.run(["sh", "-c", fact.command(sys.executable)], capture_output=True, text=True, env=env, cwd=site)
    assert r.returncode == 0, r.stderr
    return fact.parse(r.stdout)


def test_drift_is_found_and_unchanged_files_are_not_rehashed(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    make_dist(site)
    first = run(site, cache)
    assert first.version == "0.5.23" and first.pristine and first.files_hashed == first.files_checked == 2
    second = run(site, cache)
    assert second.pristine and second.files_checked == 2 and second.files_hashed == 0
    (site / "sglang/srt/server_args.py").write_bytes(b"X = 2\n")      # same size, new bytes
    third = run(site, cache)
    assert third.drift == ["sglang/srt/server_args.py"] and third.files_hashed == 1
    assert run(site, cache).drift == ["sglang/srt/server_args.py"]   # a cached verdict of drift stays drift
    (site / "sglang/srt/server_args.py").write_bytes(b"X = 1\n")
    assert run(site, cache).pristine
    (site / "sglang/__init__.py").unlink()
    assert run(site, cache).missing == ["sglang/__init__.py"]

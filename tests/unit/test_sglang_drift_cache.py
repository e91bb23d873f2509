"""The sglang RECORD check, run by a real python on a real (small) installed distribution:
drift is found, and the stat-keyed cache skips rehashing only files nobody wrote since."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys

import pytest

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


def run(site, cache, keep=True):
    env = {**os.environ, "PYTHONPATH": str(site), "FLEETSPEC_FACT_CACHE": str(cache)}
    r = subprocess.run(["sh", "-c", fact.command(sys.executable, keep=keep)], capture_output=True, text=True, env=env,
                       cwd=site)
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


def test_a_reading_that_keeps_nothing_writes_no_cache_but_reads_one(tmp_path):
    """status and --plan (keep False) write nothing on the host: no cache folder, no cache file;
    a cache a deploy kept is still read."""
    site, cache = tmp_path / "site", tmp_path / "cache"
    make_dist(site)
    assert run(site, cache, keep=False).files_hashed == 2 and not cache.exists()
    run(site, cache)                                                  # a deploy's preflight keeps it
    kept = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert run(site, cache, keep=False).files_hashed == 0
    (site / "sglang/srt/server_args.py").write_bytes(b"X = 2\n")
    assert run(site, cache, keep=False).drift == ["sglang/srt/server_args.py"]
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == kept


@pytest.mark.sglang
@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.23"])
def test_the_real_installs_are_read_as_importlib_metadata_reads_them(version, tmp_path):
    """The fact finds the dist-info and RECORD without importlib.metadata (too slow to run on every
    host at once); on the real wheels of both versions it must agree with it, file for file."""
    from fleetspec.lab.envs import local_env

    python = str(local_env(version))
    probe = ("import json; from importlib import metadata; d = metadata.distribution('sglang'); "
             "print(json.dumps([d.version, str(d._path), sum(1 for f in d.files if f.hash and f.hash.mode == 'sha256')]))")
    want_version, want_info, want_files = json.loads(
        subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout)
    env = {**os.environ, "FLEETSPEC_FACT_CACHE": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    for _ in range(2):                         # the first run hashes, the second is the fast path
        r = subprocess.run(["sh", "-c", fact.command(python, keep=True)], capture_output=True, text=True, env=env, cwd="/")
        got = fact.parse(r.stdout)
        assert (got.version, got.dist_info, got.files_checked) == (want_version, want_info, want_files)
        assert got.pristine, (got.drift[:5], got.missing[:5])

"""The torch fact, run by this machine's real python and torch: first call imports torch, the
next reads the cached build facts; a changed torch (new version.py) is imported again."""

from __future__ import annotations

import os
import subprocess
import sys

from fleetspec.remote.facts import torch as fact


def run(cache, keep=True):
    env = {**os.environ, "FLEETSPEC_FACT_CACHE": str(cache)}
    r = subprocess.run(["sh", "-c", fact.command(sys.executable, keep=keep)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return fact.parse(r.stdout), r.stdout


def test_cached_after_first_call_and_same_answer(tmp_path):
    import torch

    first, raw1 = run(tmp_path)
    assert first.version == torch.__version__ and first.cxx11_abi is not None and '"cached"' not in raw1
    second, raw2 = run(tmp_path)
    assert '"cached": true' in raw2
    assert (second.version, second.cuda, second.cxx11_abi, second.python_tag) == \
           (first.version, first.cuda, first.cxx11_abi, first.python_tag)


def test_a_stale_key_is_not_trusted(tmp_path):
    run(tmp_path)
    cache_file = next(tmp_path.glob("torch-*.json"))
    cache_file.write_text(cache_file.read_text().replace('"key": "', '"key": "stale|'))
    again, raw = run(tmp_path)
    assert '"cached"' not in raw and again.version


def test_a_reading_that_keeps_nothing_writes_no_cache(tmp_path):
    """status and --plan (keep False): torch is imported, nothing is written; a kept cache is read."""
    cache = tmp_path / "cache"
    first, raw = run(cache, keep=False)
    assert first.version and '"cached"' not in raw and not cache.exists()
    run(cache)
    _, raw = run(cache, keep=False)
    assert '"cached": true' in raw

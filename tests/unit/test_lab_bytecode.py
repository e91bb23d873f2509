"""The lab writes byte code for its own modules at `lab up` (fleetspec.lab.hosts.byte_code), so
an engine's first start leaves site-packages as it was, as after a pip install."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleetspec.lab import hosts


@pytest.mark.skipif(sys.implementation.cache_tag != hosts.HOST_CACHE_TAG, reason="the lab hosts' python is 3.11")
def test_the_byte_code_is_used_as_it_is_and_a_changed_source_is_not_trusted(tmp_path):
    site = tmp_path / "site"
    sources = {"pkg/__init__.py": b"", "pkg/mod.py": b"VALUE = 1\n", "x.pth": b"import os\n"}
    for rel, data in sources.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    code = hosts.byte_code(sources, str(site))
    assert sorted(code) == ["pkg/__pycache__/__init__.cpython-311.pyc", "pkg/__pycache__/mod.cpython-311.pyc"]
    for rel, data in code.items():
        (site / rel).parent.mkdir(exist_ok=True)
        (site / rel).write_bytes(data)
    before = {rel: os.stat(site / rel).st_ctime_ns for rel in code}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    run = [sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE)"]
    assert subprocess.run(run, cwd=site, env=env, capture_output=True, text=True, check=True).stdout == "1\n"
    assert {rel: os.stat(site / rel).st_ctime_ns for rel in code} == before     # nothing written again
    (site / "pkg" / "mod.py").write_bytes(b"VALUE = 2\n")
    assert subprocess.run(run, cwd=site, env=env, capture_output=True, text=True, check=True).stdout == "2\n"

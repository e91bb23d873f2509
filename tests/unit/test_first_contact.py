"""First contact on a fresh machine: the cache recipes must work from nothing.

Each test here stands for a failure a new user hit: pip asked for two versions of one project in
one call, a layer's offline install named a wheel the cache did not hold (torch), and the kernel
build loaded its fresh library into the process so the next load aborted it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from fleetspec.lab import envs

REPO = Path(__file__).resolve().parents[2]


def _project(requirement: str) -> tuple[str, str]:
    name, _, version = requirement.partition("==")
    return re.sub(r"[-_.]+", "-", name).lower(), version


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "WHEELS", tmp_path / "wheels")
    (tmp_path / "wheels").mkdir()
    return tmp_path / "wheels"


def test_no_pip_call_asks_for_two_versions_of_one_project(empty_cache):
    commands = envs.download_commands(envs.SGLANG_VERSIONS, python="python3")
    assert len(commands) == len(envs.SGLANG_VERSIONS)
    for command in commands:
        versions = defaultdict(set)
        for arg in command:
            if "==" in arg:
                name, version = _project(arg)
                versions[name].add(version)
        assert {n: v for n, v in versions.items() if len(v) > 1} == {}, command
    wanted = {_project(a) for c in commands for a in c if "==" in a}
    assert {_project(r) for v in envs.SGLANG_VERSIONS for r in envs.requirements(v)} == wanted


def test_every_layer_requirement_is_downloaded_torch_included(empty_cache):
    asked = {a for c in envs.download_commands(python="python3") for a in c if "==" in a}
    for version in envs.SGLANG_VERSIONS:
        assert set(envs.requirements(version)) <= asked
        assert envs.TORCH in envs.requirements(version)


def test_a_cache_without_a_wheel_is_refused_naming_it(empty_cache):
    (empty_cache / "sglang-0.5.23-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(envs.DownloadFailed, match=r"lacks .*torch==2\.13\.0"):
        envs.require_cached("0.5.23")


def test_an_unreachable_index_fails_with_one_line(empty_cache, tmp_path):
    fake_pip = tmp_path / "python"
    fake_pip.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                        "echo 'ERROR: Could not find a version that satisfies the requirement sglang==0.5.23' >&2\nexit 1\n")
    fake_pip.chmod(0o755)
    with pytest.raises(envs.DownloadFailed) as err:
        envs.download_wheels(("0.5.23",), python=str(fake_pip))
    message = str(err.value)
    assert "\n" not in message and "sglang==0.5.23" in message and "Could not find a version" in message


@pytest.mark.sglang
def test_the_real_cache_holds_every_wheel_each_layer_installs():
    """After set-up, an offline install of each layer names only wheels the cache holds."""
    if not envs.WHEELS.is_dir():
        pytest.skip("no wheel cache (run scripts/setup.sh)")
    for version in envs.SGLANG_VERSIONS:
        assert envs.missing_wheels(version) == [], version


@pytest.mark.slow
def test_a_fresh_kernel_build_loads_once_in_the_building_process(tmp_path):
    """Build into an empty cache, then load the cached copy in the same process (a child here,
    so an abort cannot take pytest down): before the fix the op registered twice and aborted."""
    pytest.importorskip("torch")
    script = (
        "import sys, torch\n"
        "from fleetspec.build.kernel import build_kernel\n"
        "k, built = build_kernel(sys.argv[1], cache=sys.argv[2])\n"
        "assert built\n"
        "torch.ops.load_library(str(k.path))\n"
        "print(torch.ops.fleetspec_ddtree.tree_mask(torch.tensor([[-1, 0, 0]])).sum().item())\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(REPO / "playbooks/ddtree/kernels/tree_mask"),
                           str(tmp_path / "kernels")], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "5"


def test_a_local_version_label_satisfies_an_exact_pin(empty_cache):
    """pip's `torch==2.13.0` installs `2.13.0+cpu`; the cache check must agree with pip."""
    (empty_cache / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert envs.cached_wheel("torch==2.13.0") is not None
    assert envs.cached_wheel("torch==2.13.1") is None

"""`fleetspec kernels build --on HOST` against a real sshd on loopback whose "host" is this machine
(its python, torch and g++): the library is compiled there, fetched into the local cache keyed by
the ABI the host reported, loads and runs; a host without torch, without a compiler, or whose
compiler rejects the source gives one line naming the host and the cause, exit 2, and leaves no
scratch folder behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fleetspec.build import kernel as KB
from fleetspec.model import kernel as K
from fleetspec.remote.files import RUN_DIR

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "playbooks/ddtree/kernels/tree_mask"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="need root (the build runs in the root-only /var/lib/fleetspec/run)")


def _scratch_with_sources() -> list[Path]:
    run = Path(RUN_DIR)
    return sorted(p for p in run.glob("scratch.*") if (p / K.KERNEL_JSON).exists()) if run.is_dir() else []


@pytest.fixture
def fleet_root(tmp_path) -> Path:
    """An empty fleet root (inventory/, playbooks/, templates/)."""
    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    return tmp_path


@pytest.fixture
def fleet(fleet_root, sshd, ssh_client_key, inventory_writer):
    def make(python: str = sys.executable) -> Path:
        inventory_writer(fleet_root / "inventory" / "lab.yaml", {"h1": sshd}, ssh_client_key,
                         command_timeout=600, host_vars={"h1": f"{{python: {python}}}"})
        return fleet_root
    return make


def _build(root: Path, cache: Path, source: Path = SOURCE, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), "kernels", "build", str(source),
                           "--on", "h1", "--cache", str(cache), *extra], capture_output=True, text=True, timeout=900)


_LOAD = """
import json, sys, torch
torch.ops.load_library(sys.argv[1])
logp, ids = torch.ops.fleetspec_ddtree.topk_logprobs(torch.tensor([[0.0, 3.0, 1.0, 3.0]]), 2)
print(json.dumps(ids.tolist()))
"""


@pytest.mark.slow
def test_a_build_on_the_host_lands_in_the_cache_keyed_by_its_abi_and_runs(fleet, tmp_path):
    before = _scratch_with_sources()
    r = _build(fleet(), tmp_path / "cache")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tree_mask: built on h1" in r.stdout
    [kernel] = K.built_kernels(SOURCE, tmp_path / "cache")
    here = KB.local_abi(False)
    assert kernel.abi == here and kernel.path.parent.name == K.cache_key(K.load_spec(SOURCE), here)
    kernel.file_bytes()
    ran = subprocess.run([sys.executable, "-c", _LOAD, str(kernel.path)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-1500:]
    assert json.loads(ran.stdout) == [[1, 3]]       # ties: the lower id first
    assert K.find_built_kernel(SOURCE, {"python_tag": here.python_tag, "torch": here.torch, "cuda": None,
                                        "cxx11_abi": here.cxx11_abi}, tmp_path / "cache").sha256 == kernel.sha256
    assert _scratch_with_sources() == before


def _one_line_exit_2(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


def test_a_host_without_torch_is_one_line(fleet, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    r = _build(fleet(str(bare / "bin/python3")), tmp_path / "cache")
    _one_line_exit_2(r, "--on h1", "no torch in", str(bare / "bin/python3"))
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_host_without_a_compiler_is_one_line_and_leaves_no_scratch(fleet, tmp_path):
    # The host's python, started with a PATH that has no compiler on it (the lab's ct129 has none
    # at all: tests/lab/test_kernel_release.py).
    wrapper = tmp_path / "python-no-cc"
    wrapper.write_text(f"#!/bin/sh\nPATH=/nonexistent exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    before = _scratch_with_sources()
    r = _build(fleet(str(wrapper)), tmp_path / "cache")
    _one_line_exit_2(r, "--on h1", "no C++ compiler")
    assert _scratch_with_sources() == before


def test_a_source_the_compiler_rejects_is_one_line_and_leaves_no_scratch(fleet, tmp_path):
    broken = tmp_path / "tree_mask"
    shutil.copytree(SOURCE, broken)
    spec = K.load_spec(broken)
    cpp = broken / spec.sources[0]
    cpp.write_text(cpp.read_text() + "\nthis is not C++;\n")
    before = _scratch_with_sources()
    r = _build(fleet(), tmp_path / "cache", broken)
    _one_line_exit_2(r, "--on h1", "failed (exit 1)", "error")
    assert _scratch_with_sources() == before


def test_on_refuses_flags_that_mean_a_local_build(fleet, tmp_path):
    r = _build(fleet(), tmp_path / "cache", SOURCE, "--out", str(tmp_path / "out"))
    _one_line_exit_2(r, "--on builds on the host")


def test_cuda_asked_of_a_host_whose_torch_is_a_cpu_build_is_one_line(fleet, tmp_path):
    if torch.version.cuda:
        pytest.skip("this machine's torch is a CUDA build")
    r = _build(fleet(), tmp_path / "cache", SOURCE, "--cuda", "--arch", "9.0")
    _one_line_exit_2(r, "--on h1", f"its torch {torch.__version__} is a CPU build")

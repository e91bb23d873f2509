"""Kernels for each host's real ABI, on lab hosts (real sshd, real systemd, real containers):

- `fleetspec kernels build --on ct129` compiles with that host's python and torch, or, where the
  host has no compiler (the lab image has none), says so in one line, exit 2, and leaves no scratch
  folder on the host.
- A CUDA-tagged artifact built on this GPU-less machine (scripts/cuda-toolchain.sh + `kernels build
  --cuda --arch 9.0 --torch-root ... --cuda-home ...`) is what a deploy's preflight picks for a host
  whose facts say CUDA 13.0 / sm 9.0, and a host whose GPUs are another arch is refused, naming both
  sides and the build command. The CUDA host is presented by a lab container with a recorded-shape
  `nvidia-smi` on its PATH and, in a separate venv (not the host's real one), a `torch` that only
  reports a CUDA build's facts; both are removed afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.lab import labtools

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "playbooks/ddtree/kernels/tree_mask"
SMI = REPO / "tests/fixtures/nvidia-smi/query-gpu-h200.csv"
TOOLCHAIN = Path(os.environ.get("FLEETSPEC_CACHE", "/var/cache/fleetspec")) / "cuda-toolchain/torch-2.11.0-cuda13.0"
FAKE = "/opt/fleetspec-test-cuda"
FAKE_TORCH = '''"""Not torch: only the facts a CUDA 13.0 build of torch 2.11.0 reports (fleetspec's lab test)."""
__version__ = "2.11.0+cu130"
class version:
    cuda = "13.0"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class cuda:
    is_available = staticmethod(lambda: True)
    get_arch_list = staticmethod(lambda: ["sm_90"])
'''


def _no_scratch(lab_fleet, host: str) -> str:
    return labtools.sh(lab_fleet, host, "ls -A /var/lib/fleetspec/run 2>/dev/null | grep '^scratch' || true").strip()


def test_kernels_build_on_a_lab_host(lab_fleet, tmp_path):
    host = lab_fleet.hosts[0]
    has_cc = lab_fleet.run(host, "command -v c++ || command -v g++").returncode == 0
    r = labtools.fs(lab_fleet, "kernels", "build", str(SOURCE), "--on", host, "--cache", str(tmp_path / "cache"))
    if not has_cc:
        assert r.returncode == 2, r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"kernels build --on {host}: no C++ compiler" in r.stderr, r.stderr
        assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())
    else:
        assert r.returncode == 0, r.stdout + r.stderr
        from fleetspec.model import kernel as K

        [kernel] = K.built_kernels(SOURCE, tmp_path / "cache")
        assert kernel.abi.cuda == "cpu" and kernel.abi.torch.startswith("2.13.0")
    assert _no_scratch(lab_fleet, host) == ""


@pytest.fixture(scope="module")
def cuda_kernel():
    """The CUDA build made here without a GPU (the toolchain is fetched by scripts/cuda-toolchain.sh,
    or by prepare under FLEETSPEC_CUDA_BUILD=1)."""
    from fleetspec.build import kernel as KB
    from tests.unit.test_kernel_abi import TOOLCHAIN_SKIP

    if not (TOOLCHAIN / ".complete").is_file():
        pytest.skip(TOOLCHAIN_SKIP)

    kernel, _ = KB.build_kernel_offline(SOURCE, TOOLCHAIN / "torch-wheel", TOOLCHAIN / "cuda/nvidia/cu13", "9.0")
    return kernel


@pytest.fixture
def cuda_host(lab_fleet, tmp_path):
    """hosts[1] presented as a CUDA host through a separate venv; yields (host, fleet root, set_arch)."""
    host = lab_fleet.hosts[1]
    data = yaml.safe_load((lab_fleet.root / "inventory/lab.yaml").read_text())
    real = data["hosts"][host]["vars"]["python"]
    site = labtools.sh(lab_fleet, host, f"{shlex.quote(real)} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'").strip()
    fake_python = f"{FAKE}/venv/bin/python3"
    labtools.sh(lab_fleet, host, " && ".join([
        f"python3 -m venv --without-pip {FAKE}/venv",
        f"fsite=$({fake_python} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')",
        'mkdir -p "$fsite/torch"',
        f'printf %s {shlex.quote(FAKE_TORCH)} > "$fsite/torch/__init__.py"',
        "printf '__version__ = \"2.11.0+cu130\"\\ncuda = \"13.0\"\\n' > \"$fsite/torch/version.py\"",
        f'printf "%s\\n" {shlex.quote(site)} > "$fsite/real-site.pth"',
        f"printf %s {shlex.quote(SMI.read_text())} > {FAKE}/query-gpu.csv",
        f"printf '#!/bin/sh\\ncat {FAKE}/query-gpu.csv\\n' > /usr/local/bin/nvidia-smi",
        "chmod 0755 /usr/local/bin/nvidia-smi"]))
    root = tmp_path / "fleet"
    for folder in ("playbooks", "templates"):
        shutil.copytree(lab_fleet.root / folder, root / folder, symlinks=True)
    data["hosts"][host]["vars"]["python"] = fake_python
    # its nvidia-smi answers the gpu fact's query only: GPU health (docs/gpu.md) is not this test's
    from fleetspec.model.gpuhealth import CHECKS
    data["hosts"][host]["vars"].setdefault("extra", {})["gpu_waive"] = list(CHECKS)
    text = yaml.safe_dump(data, sort_keys=False).replace("../.lab/", f"{lab_fleet.root}/.lab/")
    (root / "inventory").mkdir()
    (root / "inventory/lab.yaml").write_text(text)

    def set_arch(cap: str) -> None:
        labtools.sh(lab_fleet, host, f"sed -i 's/, [0-9.]*$/, {cap}/' {FAKE}/query-gpu.csv")

    fact_cache = "/var/cache/fleetspec/torch-%s.json" % hashlib.sha256(fake_python.encode()).hexdigest()[:16]
    try:
        yield host, root, set_arch
    finally:
        labtools.sh(lab_fleet, host, f"rm -rf {FAKE} /usr/local/bin/nvidia-smi {fact_cache}")


def _plan(root: Path, host: str) -> subprocess.CompletedProcess:
    # budget 15: with this host's GPU facts (H200, TP 1, 32 requests at once) sglang's graph holds
    # 32 x 16 verify tokens; a 65-node tree would be refused by the graph sizing before the kernels
    return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), "deploy", host, "--algo", "ddtree",
                           "--set", "budget=15", "--plan", "--json"], capture_output=True, text=True, timeout=600)


def test_a_cuda_artifact_built_here_is_picked_for_a_cuda_host_and_another_arch_is_refused(
        lab_fleet, cuda_kernel, cuda_host):
    host, root, set_arch = cuda_host
    assert (cuda_kernel.abi.cuda, cuda_kernel.abi.arch_list, cuda_kernel.abi.torch) == ("13.0", ("9.0",), "2.11.0+cu130")
    r = _plan(root, host)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    outcome = json.loads(r.stdout.strip().splitlines()[-1])
    assert outcome["plan"]["kernels"] == {"tree_mask.so": cuda_kernel.sha256}, outcome
    releases = "ls -A /var/lib/fleetspec/sglang-qwen/releases 2>/dev/null || true"
    before = labtools.sh(lab_fleet, host, releases)
    set_arch("10.0")
    r = _plan(root, host)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if "GPU arch" in ln]
    assert said, r.stdout[-2000:] + r.stderr[-2000:]
    assert "9.0" in said[0] and "10.0" in said[0] and host in said[0], said[0]
    assert "fleetspec kernels build --cuda --arch '10.0'" in said[0], said[0]
    assert labtools.sh(lab_fleet, host, releases) == before

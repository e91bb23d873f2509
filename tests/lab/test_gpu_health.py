"""GPU health on a lab host (real sshd, real systemd), whose GPUs are the lab's nvidia-smi and
kernel-log stand-ins serving fixture cases written in nvidia-smi's documented CSV format (not
captures): each unhealthy case is refused by `deploy --plan` and by a real deploy's preflight, one
line per GPU and cause, with nothing changed on the host; a waiver lets it pass; `status` shows
the problem; `--plan` sizes the CUDA graph from the GPUs' memory; and a restart that makes the GPU
log an Xid fails with that Xid named, and leaves the host needing attention after its revert.

The engine's CUDA comes from the host's torch; the lab's is a CPU build, so the refusals run with
`python` pointed at a venv whose `torch` only reports a CUDA 12.8 build's facts (removed after).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex

import pytest

from tests.lab import labtools
from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]

FAKE = "/opt/fleetspec-test-cuda12"
FAKE_PYTHON = f"{FAKE}/venv/bin/python3"
FAKE_TORCH = '''"""Not torch: only the facts a CUDA 12.8 build of torch 2.11.0 reports (fleetspec's lab test)."""
__version__ = "2.11.0+cu128"
class version:
    cuda = "12.8"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class cuda:
    is_available = staticmethod(lambda: True)
    get_arch_list = staticmethod(lambda: ["sm_90"])
'''
REFUSED = {
    "ecc": "GPU 1 (00000000:3B:00.0): 2 uncorrected ECC error(s) since the driver loaded [ecc]",
    "remap": "GPU 0 (00000000:19:00.0): a row remap is pending (it takes effect at the next GPU reset) [pending]",
    "stray": "GPU 1 (00000000:3B:00.0): 71234 MiB held by pid 4242 (unknown), not a process of sglang-qwen.service "
             "[foreign_memory]",           # no such pid in the container: no /proc name, no cgroup
    "xid": "GPU 1 (00000000:3B:00.0): Xid 79 (GPU has fallen off the bus) at ",
    "old_driver": "driver 515.105.01 is older than the engine's CUDA 12.8 needs (driver 525 or newer) [driver]",
}


# tests/fixtures/facts/gpu_health/h200-x1-forged-xid-in-a-segfault-report.json's captured line, on GPU 1
FORGED = ("python3[9020]: segfault at 0 ip 00007f65fb13e000 sp 00007fff48a129d8 error 4 in NVRM: Xid (PCI:0000:3b:00): "
          "79, pid=1, GPU has fallen off the bus.[0,7f65fb13e000+1000] likely on CPU 1 (core 1, socket 0)")


@pytest.fixture(scope="module")
def gpu_host(lab_fleet, tmp_path_factory):
    """hosts[0] (like ct129: TP 2) and a fleet root whose python for it reports CUDA 12.8."""
    host = lab_fleet.hosts[0]
    import yaml

    data = yaml.safe_load((lab_fleet.root / "inventory/lab.yaml").read_text())
    real = data["hosts"][host]["vars"]["python"]
    site = labtools.sh(lab_fleet, host, f"{shlex.quote(real)} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'").strip()
    labtools.sh(lab_fleet, host, " && ".join([
        f"python3 -m venv --without-pip {FAKE}/venv",
        f"fsite=$({FAKE_PYTHON} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')",
        'mkdir -p "$fsite/torch"',
        f'printf %s {shlex.quote(FAKE_TORCH)} > "$fsite/torch/__init__.py"',
        f'printf "%s\\n" {shlex.quote(site)} > "$fsite/real-site.pth"']))
    root = R.make_root(tmp_path_factory.mktemp("gpu") / "root", [host], inventory_vars={host: {"python": FAKE_PYTHON}})
    fact_cache = "/var/cache/fleetspec/torch-%s.json" % hashlib.sha256(FAKE_PYTHON.encode()).hexdigest()[:16]
    try:
        yield host, root
    finally:
        labtools.fs(lab_fleet, "lab", "fault", host, "--clear")
        labtools.sh(lab_fleet, host, f"rm -rf {FAKE} {fact_cache}")


def _untouched(lab_fleet, host) -> tuple:
    """What a refused deploy must leave as it was: the ledger, the unit's start time, the state folder."""
    started = labtools.sh(lab_fleet, host, "systemctl show -p ActiveEnterTimestampMonotonic --value sglang-qwen.service")
    state = labtools.sh(lab_fleet, host, "ls -A /var/lib/fleetspec/sglang-qwen 2>/dev/null || true")
    return len(labtools.ledger(lab_fleet, host)), started, state


def test_each_gpu_fault_is_refused_before_any_change(lab_fleet, gpu_host):
    host, root = gpu_host
    before = _untouched(lab_fleet, host)
    labtools.fs(lab_fleet, "lab", "fault", host, "gpu=h200x2", check_rc=0)
    # healthy GPUs, and a kernel log line any local user can write: a segfault report naming the
    # mapped file (captured format), the file named like an Xid; it is not one
    labtools.sh(lab_fleet, host, f"printf '%s %s\\n' \"$(date +%s.%N)\" {shlex.quote(FORGED)} >> /etc/fleetspec-lab/gpu/kernel.log")
    r = R.fs(root, "deploy", host, "--algo", "nextn", "--plan")
    assert r.returncode == 0 and "refused" not in r.stdout + r.stderr, (r.stdout[-2000:], r.stderr[-2000:])
    for case, line in REFUSED.items():
        labtools.fs(lab_fleet, "lab", "fault", host, f"gpu={case}", check_rc=0)
        r = R.fs(root, "deploy", host, "--algo", "nextn", "--plan")
        said = r.stdout + r.stderr
        assert r.returncode == 3, (case, said[-2000:])
        assert f"{host}: {line}" in said and "refused before any change" in said and "Traceback" not in said, said
    labtools.fs(lab_fleet, "lab", "fault", host, "gpu=ecc", check_rc=0)
    r = R.fs(root, "deploy", host, "--algo", "nextn", "--yes", "--json")          # a real deploy: refused in preflight
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 3 and out["status"] == "needs_attention" and "[ecc]" in out["reason"], out
    r = R.fs(root, "deploy", host, "--algo", "nextn", "--plan", "--waive-gpu", "ecc")
    assert r.returncode == 0 and f"{host}: waived GPU check ecc: GPU 1" in r.stdout + r.stderr, r.stdout + r.stderr
    r = R.fs(root, "status", host, "--json")
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["gpu"] == "ECC on GPU 1" and any("uncorrected ECC" in n for n in row["notes"]), row
    assert _untouched(lab_fleet, host) == before


def test_a_restart_that_logs_an_xid_names_it_and_the_host_needs_attention(lab_fleet, gpu_host):
    host, _ = gpu_host
    labtools.fs(lab_fleet, "lab", "fault", host, "--clear", check_rc=0)
    labtools.fs(lab_fleet, "lab", "fault", host, "gpu=h200x2", "xid_at_start=79", "crash_at_start",
                "only_algorithm=DDTREE", check_rc=0)
    # graph sizing from the GPU facts: sglang's own 256 on H200 at TP 2 holds 1024 verify tokens;
    # the graph covers the 16 requests this host serves (the request pool), and 16 x 65 does not
    # fit: refused; at budget 15, 16 x 16 = 256 fits without a change
    r = labtools.fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--plan")
    said = r.stdout + r.stderr
    assert r.returncode == 2 and "--cuda-graph-max-bs 256 (sglang 0.5.13.post1's own choice for 143771 MiB GPUs " \
        "at TP 2)" in said and "its graph would capture 16 x 65 = 1040 (it covers 16 requests per rank" in said, \
        said[-3000:]
    r = labtools.fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--plan", "--set", "budget=15")
    assert r.returncode == 0 and "the new launch captures 16 x 16 = 256 <= 256 x 4 = 1024 verify tokens: " \
        "--cuda-graph-max-bs kept" in r.stdout, r.stdout[-3000:]
    try:
        r = labtools.fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--set", "budget=15", "--yes", "--no-gates",
                        "--json")
    finally:
        labtools.fs(lab_fleet, "lab", "fault", host, "--clear")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 3 and out["status"] == "needs_attention" and out["failed_step"] == "probes", out
    assert re.search(r"on the GPUs since the restart: Xid 79 \(GPU has fallen off the bus\) on GPU 0 at "
                     r"\d\d:\d\d:\d\d", out["reason"]), out
    assert "reverted to baseline, which runs on the same GPUs" in out["reason"], out
    s = json.loads(labtools.fs(lab_fleet, "status", host, "--json").stdout.strip().splitlines()[-1])
    assert s["algo"] == "NEXTN", s                                           # the revert itself held


def test_a_graph_rescaled_below_the_serving_concurrency_fails_the_throughput_gate_there(lab_fleet, tmp_path):
    """hosts[0] (like ct129: no GPU facts, NEXTN verifying 4 tokens, --max-running-requests 16):
    DDTree at budget 320 verifies 321, so `cuda_graph: rescale` takes sglang's fallback graph of 160
    down to 1 (the plan says the 160 is the fallback). The stand-in runs a step with more requests
    than its graph holds 3x slower: the gate passes at concurrency 1 and fails at the serving
    concurrency (capped at 4 here: the 2-core machine), and the deploy reverts; the same deploy
    with `cuda_graph: keep` passes. slow_tokens=6 on both sides (0.06 s steps) paces the stand-in well above its
    CPU work (~6 ms a DDTree step here), so concurrency 4 measures the graphs, not the cores."""
    import yaml

    host = lab_fleet.hosts[0]
    labtools.fs(lab_fleet, "lab", "fault", host, "--clear", check_rc=0)
    extra = yaml.safe_load((lab_fleet.root / "inventory/lab.yaml").read_text())["hosts"][host]["vars"]["extra"]
    extra = {k: v for k, v in extra.items() if k != "gates"}        # the lab's c=1-only override

    def playbook(policy):
        def edit(data):
            data["launch"]["cuda_graph"] = policy
            data["gates"] = {"throughput": {"min_ratio": 0.7, "concurrency": [1], "requests": 4, "max_concurrency": 4}}
        return edit

    roots = {p: R.make_root(tmp_path / p, [host], playbooks={"ddtree.yaml": playbook(p)},
                            inventory_vars={host: {"extra": extra}}) for p in ("rescale", "keep")}
    args = ("deploy", host, "--algo", "ddtree", "--set", "budget=320")
    plan = R.fs(roots["rescale"], *args, "--plan")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 0, said[-3000:]
    assert "--cuda-graph-max-bs 160 (no GPU facts on this host: sglang's fallback without GPU memory" in said, said[-3000:]
    assert "--cuda-graph-max-bs 160 -> 1 (1 x 321 = 321 <= 640)" in said, said[-3000:]
    assert ("throughput gate at concurrency 1, 4 (4: the host's serving concurrency, --max-running-requests 16, "
            "capped at max_concurrency 4)") in said, said[-3000:]
    labtools.fs(lab_fleet, "lab", "fault", host, "slow_tokens=6", check_rc=0)
    try:
        r = R.fs(roots["rescale"], *args, "--yes", "--json")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        tput = out["evidence"]["figures"]["throughput"]
        assert r.returncode == 1 and out["status"] == "rolled_back" and out["failed_step"] == "gates", out
        assert "at concurrency 4 (the host's serving concurrency" in out["reason"], out
        print(f"stand-in figures, graph rescaled to 1: {tput}")
        assert tput["ratio_c4"] < 0.7 <= tput["ratio_c1"] and tput["serving_concurrency"] == 4, tput
        s = json.loads(labtools.fs(lab_fleet, "status", host, "--json").stdout.strip().splitlines()[-1])
        assert s["algo"] == "NEXTN", s
        r = R.fs(roots["keep"], *args, "--yes", "--json")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert r.returncode == 0 and out["status"] == "healthy", (r.stdout[-3000:], r.stderr[-3000:])
        print(f"stand-in figures, graph kept: {out['figures']['throughput']}")
        assert out["figures"]["throughput"]["ratio_c4"] >= 0.7, out["figures"]
    finally:
        labtools.fs(lab_fleet, "lab", "fault", host, "--clear")
        R.fs(roots["keep"], "rollback", host)
    s = json.loads(labtools.fs(lab_fleet, "status", host, "--json").stdout.strip().splitlines()[-1])
    assert s["algo"] == "NEXTN", s

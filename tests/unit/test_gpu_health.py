"""GPU health: the one-command fact (nvidia-smi's GPU, remapped-row and compute-app queries, the
processes' cgroups, Xid lines of the kernel log) run for real over the loopback sshd against the
lab's nvidia-smi and journalctl stand-ins serving each fixture case (tests/fixtures/nvidia-smi/
health/, written in nvidia-smi's documented CSV format, not captured), then the preflight rules:
one refusal line per GPU and cause, waivers checked at load, and what a restart added."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

from fleetspec.errors import ConfigError, NeedsAttention
from fleetspec.lab import gpu as lab_gpu
from fleetspec.model import gpuhealth
from fleetspec.model.inventory import load_inventory
from fleetspec.model.playbook import load_playbook
from fleetspec.ops import gpu_checks
from fleetspec.remote import facts
from fleetspec.remote.facts import gpu_health

REPO = Path(__file__).resolve().parents[2]


class WithPath:
    """The transport with the stand-ins first on PATH (a lab host has them in /usr/local/bin)."""

    def __init__(self, t, folder: Path):
        self.t, self.name = t, "h"
        self.prefix = (f"export PATH={shlex.quote(str(folder / 'bin'))}:$PATH "
                       f"FLEETSPEC_LAB_GPU={shlex.quote(str(folder / 'gpu'))}\n")

    def run_script(self, script, **kw):
        return self.t.run_script(self.prefix + script, **kw)


@pytest.fixture
def host_with(t, tmp_path):
    """Install one fixture case with the lab's own install script, in a folder; the transport."""
    def install(case: str, now: float | None = None) -> WithPath:
        script = lab_gpu.install_script(case, now or time.time(), etc=str(tmp_path / "gpu"),
                                        bin_dir=str(tmp_path / "bin"), python=sys.executable)
        t.run_script(script, check=True)
        return WithPath(t, tmp_path)
    return install


def read(tp) -> gpu_health.GpuHealth:
    return facts.gather(tp, gpu_health, service="sglang-qwen.service")


def found(health, cuda="12.8", need=(2, "TP 2")) -> list[tuple[str, int | None]]:
    return [(p.check, p.gpu) for p in gpuhealth.problems(health, need, cuda, "sglang-qwen.service")]


@pytest.mark.parametrize("case, want", [
    ("h200x2", []),
    ("ecc", [("ecc", 1)]),
    ("remap", [("pending", 0)]),
    ("stray", [("foreign_memory", 1)]),
    ("xid", [("xid", 1)]),
    ("old_driver", [("driver", None)]),
])
def test_each_fixture_case_is_read_in_one_command_and_found(host_with, seen, case, want):
    tp = host_with(case)
    seen.clear()
    health = read(tp)
    assert len(seen) == 1, "one round trip"
    assert health.present and [g.index for g in health.gpus] == [0, 1]
    assert {g.name for g in health.gpus} == {"NVIDIA H200"} and health.gpus[1].pci == "0000:3b:00"
    assert health.kernel_log == "journal" and not health.unread
    assert found(health) == want


def test_an_old_driver_is_asked_again_with_the_old_field_name(host_with):
    health = read(host_with("old_driver"))
    assert [g.driver for g in health.gpus] == ["515.105.01", "515.105.01"]
    assert health.gpus[0].clock_event_reasons == "0x0000000000000000"
    [p] = gpuhealth.problems(health, None, "12.4", "x.service")
    assert p.line == "driver 515.105.01 is older than the engine's CUDA 12.4 needs (driver 525 or newer)"
    assert gpuhealth.problems(health, None, "11.8", "x.service") == []      # CUDA 11 runs on 515
    assert gpuhealth.problems(health, None, None, "x.service") == []        # a CPU torch: no CUDA to serve


def test_the_xid_is_named_with_its_gpu_time_and_meaning(host_with):
    at = time.mktime((2026, 12, 3, 12, 1, 7, 0, 0, -1))
    health = read(host_with("xid", now=at))
    [x] = health.xids
    assert (x.code, x.pci, x.at) == (79, "0000:3b:00", at)
    [p] = gpuhealth.problems(health, None, None, "x.service")
    assert p.line == ("GPU 1 (00000000:3B:00.0): Xid 79 (GPU has fallen off the bus) at 2026-12-03 12:01:07 "
                      "in the kernel log since boot")


def test_no_nvidia_smi_is_no_gpu(t):
    assert read(WithPath(t, Path("/nonexistent"))).present is False


def test_preflight_refuses_one_line_per_gpu_and_cause_and_a_waiver_lets_it_pass(host_with, tmp_path):
    health = read(host_with("ecc"))
    both = gpu_health.GpuHealth(present=True, gpus=[*health.gpus], xids=[gpu_health.XidEvent(48, "0000:19:00", None, "x")],
                                kernel_log="journal")
    host = load_inventory(_inventory(tmp_path, {})).hosts["h"]
    book = load_playbook(REPO / "playbooks/nextn.yaml")
    with pytest.raises(NeedsAttention) as err:
        gpu_checks.check_gpu_health(host, book, both, (4, "TP 2 x DP 2"), "12.8")
    lines = str(err.value).splitlines()
    assert lines[:3] == ["h: nvidia-smi shows 2 GPU(s); the launch uses 4 (TP 2 x DP 2) [gpu_count]",
                         "h: GPU 1 (00000000:3B:00.0): 2 uncorrected ECC error(s) since the driver loaded [ecc]",
                         "h: GPU 0 (00000000:19:00.0): Xid 48 (double-bit ECC error) at an unknown time in the "
                         "kernel log since boot [xid]"]
    assert lines[3].startswith("h: refused before any change; waive one check with --waive-gpu CHECK")
    assert err.value.exit_code == 3 and "nvidia-smi -q" in err.value.command
    waived = load_inventory(_inventory(tmp_path, {"gpu_waive": ["ecc", "xid", "gpu_count"]})).hosts["h"]
    notes = gpu_checks.check_gpu_health(waived, book, both, (4, "TP 2 x DP 2"), "12.8")
    assert [n.split(":", 2)[1] for n in notes] == [" waived GPU check gpu_count", " waived GPU check ecc",
                                                  " waived GPU check xid"]


def test_the_unit_s_own_processes_hold_memory_without_a_refusal():
    app = gpu_health.ComputeApp("00000000:19:00.0", 77, 70000, "python3", "/system.slice/sglang-qwen.service")
    health = gpu_health.GpuHealth(present=True, apps=[app], unit_cgroup="/system.slice/sglang-qwen.service")
    assert gpuhealth.problems(health, None, None, "sglang-qwen.service") == []
    other = gpu_health.GpuHealth(present=True, apps=[app], unit_cgroup="/system.slice/sglang-qwen.service2")
    assert [p.check for p in gpuhealth.problems(other, None, None, "s")] == ["foreign_memory"]


def _inventory(tmp_path: Path, extra: dict) -> Path:
    import yaml

    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"h": {"address": "h.example", "vars": {"extra": extra}}}}))
    return path


@pytest.mark.parametrize("value, expected", [
    ("ecc", "expected a list"), (["ecc", "nope"], "unknown GPU check 'nope'")])
def test_waivers_are_checked_at_load_in_one_line(tmp_path, value, expected):
    with pytest.raises(ConfigError) as err:
        load_inventory(_inventory(tmp_path, {"gpu_waive": value}))
    assert "hosts.h.vars.extra.gpu_waive" in str(err.value) and expected in str(err.value)
    assert len(str(err.value).splitlines()) == 1
    book = tmp_path / "playbooks" / "nextn.yaml"
    book.parent.mkdir()
    book.write_text((REPO / "playbooks/nextn.yaml").read_text() + f"gpu_health: {{waive: {value!r}}}\n")
    with pytest.raises(ConfigError) as err:
        load_playbook(book)
    assert "gpu_health.waive" in str(err.value) and expected in str(err.value)


def test_the_playbook_waiver_is_read(tmp_path):
    book = tmp_path / "nextn.yaml"
    book.write_text((REPO / "playbooks/nextn.yaml").read_text() + "gpu_health: {waive: [foreign_memory]}\n")
    assert load_playbook(book).gpu_waive == ("foreign_memory",)


def test_a_restart_that_adds_an_xid_is_named(host_with, tmp_path):
    tp = host_with("h200x2")
    before = read(tp)
    host = load_inventory(_inventory(tmp_path, {})).hosts["h"]
    assert gpu_checks.cause_since(tp, host, before) == []
    at = time.time()
    with open(tmp_path / "gpu" / "kernel.log", "a") as fh:
        fh.write(f"{at:.6f} NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus.\n")
    said = gpu_checks.cause_since(tp, host, before)
    assert said == [f"Xid 79 (GPU has fallen off the bus) on GPU 1 at {time.strftime('%H:%M:%S', time.localtime(at))}"]
    assert gpu_checks.cause_since(tp, host, None) == []        # no GPUs read at preflight: nothing to compare


def test_the_engine_stand_in_logs_its_xid_for_gpu_0(host_with, tmp_path, monkeypatch):
    host_with("h200x2")
    from fleetspec.lab.engine.fleetspec_lab_engine import settings

    monkeypatch.setattr(settings, "ETC", tmp_path)
    line = settings.log_xid(79)
    assert line.startswith("NVRM: Xid (PCI:0000:19:00): 79, pid=")
    [x] = gpu_health.parse_xids((tmp_path / "gpu" / "kernel.log").read_text().splitlines(), "journal", None)
    assert (x.code, x.pci) == (79, "0000:19:00")


def test_parse_sections_unread_parts_and_dmesg_times():
    out = "\n".join([
        "__FLEETSPEC_GPU__ clock", "1764763200", "1764700000",
        "__FLEETSPEC_GPU__ gpus", "0, GPU-a, 00000000:19:00.0, NVIDIA A10G, 535.1, 23028, 0, [N/A], [N/A], [N/A]",
        "__FLEETSPEC_GPU__ rc 0",
        "__FLEETSPEC_GPU__ remap", "Remapped rows are not supported on this GPU", "__FLEETSPEC_GPU__ rc 2",
        "__FLEETSPEC_GPU__ apps", "No running processes found", "__FLEETSPEC_GPU__ rc 0",
        "__FLEETSPEC_GPU__ owners", "__FLEETSPEC_GPU__ unit", "__FLEETSPEC_GPU__ rc 0",
        "__FLEETSPEC_GPU__ xid", "dmesg", "[  120.500000] NVRM: Xid (PCI:0000:19:00): 48, pid=9, DBE",
        "__FLEETSPEC_GPU__ rc 0"])
    health = gpu_health.parse(out)
    g = health.gpus[0]
    assert (g.ecc_uncorrected, g.retired_pending, g.clock_event_reasons) == (None, None, None)
    assert health.unread == ["nvidia-smi --query-remapped-rows: Remapped rows are not supported on this GPU"]
    assert health.apps == [] and health.kernel_log == "dmesg"
    assert [(x.code, x.at) for x in health.xids] == [(48, 1764700120.5)]


def test_gpus_needed_from_the_launch():
    assert gpuhealth.gpus_needed({"tp_size": "2"}) == (2, "TP 2")
    assert gpuhealth.gpus_needed({"tp_size": "2", "dp_size": "2"}) == (4, "TP 2 x DP 2")
    assert gpuhealth.gpus_needed({"tp_size": "4", "dp_size": "4", "enable_dp_attention": None}) == (4, "TP 4")
    assert gpuhealth.gpus_needed({"tp_size": "8", "nnodes": "2"}) == (4, "TP 8 over 2 nodes")
    assert gpuhealth.gpus_needed({}) is None


def test_status_column_in_a_few_words():
    ps = [gpuhealth.Problem("ecc", "x", 1), gpuhealth.Problem("xid", "y", 3), gpuhealth.Problem("xid", "z", 1)]
    assert gpuhealth.column(ps) == "ECC on GPU 1; Xid on GPU 3,1"
    assert gpuhealth.column([]) == "ok"


def test_gpus_needed_reads_both_versions_spellings():
    from fleetspec.model import graphsize, launch

    for version in ("0.5.13.post1", "0.5.23"):
        table = launch.load_table(version)
        argv = ["/v/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "2", "--dp-size", "2"]
        d = launch.derive(launch.classify(argv, path=argv[0]), table, [], carry=(), version=version)
        assert gpuhealth.gpus_needed(graphsize.given(d.kept, table)) == (4, "TP 2 x DP 2"), version


def test_an_unknown_waiver_on_the_command_line_is_refused_before_any_host(tmp_path):
    import subprocess

    (tmp_path / "inventory").mkdir()
    _inventory(tmp_path / "inventory", {}).rename(tmp_path / "inventory" / "production.yaml")
    r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(tmp_path), "deploy", "h", "--algo", "nextn",
                        "--waive-gpu", "nope"], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "'nope' is not one of" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("case, verdict, finding", [
    ("h200x2", "PASS gpu-health: 2 GPU(s) (NVIDIA H200", None),
    ("ecc", "PASS gpu-health: 2 GPU(s)", "INFO gpu-health finding [ecc]: GPU 1"),
])
def test_gpu_check_script_reads_the_health_and_graph_size_from_nvidia_smi(host_with, tmp_path, case, verdict, finding):
    """scripts/gpu-check.sh's health part, as it runs on a GPU machine, here on the lab's
    nvidia-smi stand-in (a fixture case first on PATH): the collection parses, findings are
    printed, the raw output is kept, and sglang's graph size for these GPUs is said."""
    import os
    import subprocess

    host_with(case)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FLEETSPEC_LAB_GPU": str(tmp_path / "gpu"),
           "GPU_CHECK_HEALTH_ONLY": "1", "OUT": str(out), "PYTHONPATH": str(REPO), "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(REPO / "scripts/gpu-check.sh")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and verdict in r.stdout, (r.stdout, r.stderr)
    assert "INFO graph size sglang 0.5.13.post1 picks for 143771 MiB GPUs: TP 1: 256, TP 2: 256, TP 4: 512" in r.stdout
    assert finding is None or finding in r.stdout, r.stdout
    assert "__FLEETSPEC_GPU__" in (out / "gpu-health.txt").read_text()
    assert not [line for line in r.stdout.splitlines() if line.startswith("FAIL")], r.stdout   # health only: no build


def test_a_captured_h200_reads_as_one_healthy_gpu_and_refuses_a_launch_needing_two():
    """nvidia-smi's real output (tests/fixtures/facts/gpu_health/h200-x1-captured.json: one H200,
    driver 580, kernel log from dmesg) parses with nothing unread and passes every rule for TP 1
    under CUDA 13.0; the same GPU under a TP 2 launch is the one count refusal."""
    import json

    case = json.loads((REPO / "tests/fixtures/facts/gpu_health/h200-x1-captured.json").read_text())
    health = gpu_health.parse(case["stdout"])
    assert [(g.name, g.memory_total_mib, g.driver) for g in health.gpus] == [("NVIDIA H200", 143771, "580.159.04")]
    assert health.unread == [] and health.kernel_log == "dmesg" and health.xids == []
    assert found(health, cuda="13.0", need=(1, "TP 1")) == []
    assert found(health, cuda="13.0", need=(2, "TP 2")) == [("gpu_count", None)]


def test_an_xid_forged_in_a_segfault_report_is_not_an_xid(host_with, tmp_path):
    """A segfault report prints the mapped file's name as it is, so any local user can put
    `NVRM: Xid (…): 79` on a kernel log line (tests/fixtures/facts/gpu_health/h200-x1-forged-xid-in-a-
    segfault-report.json: the line captured from dmesg, the name replaced). Only a line whose
    message starts with it is an Xid: read through the journal stand-in over a real sshd, the
    forged line passes preflight's GPU rules and a real Xid after it is still found."""
    import json

    case = json.loads((REPO / "tests/fixtures/facts/gpu_health/h200-x1-forged-xid-in-a-segfault-report.json").read_text())
    forged = next(ln for ln in case["stdout"].splitlines() if "segfault" in ln)
    message = forged.split("] ", 1)[1]               # as the kernel wrote it, without dmesg's uptime
    assert gpu_health.parse_xids([forged], "dmesg", 0.0) == []
    tp = host_with("h200x2")
    at = time.time()
    with open(tmp_path / "gpu" / "kernel.log", "a") as fh:
        fh.write(f"{at:.6f} {message.replace('0000:00:06', '0000:3b:00')}\n")
    health = read(tp)
    assert health.kernel_log == "journal" and health.xids == [] and found(health) == []
    with open(tmp_path / "gpu" / "kernel.log", "a") as fh:
        fh.write(f"{at:.6f} NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus.\n")
    assert [(x.code, x.pci) for x in read(tp).xids] == [(79, "0000:3b:00")]

"""Fact parsers on real (or clearly marked source-derived) output, and batching over a real sshd."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetspec.model.inventory import load_inventory
from fleetspec.ops.argv import speculative_algorithm_from_argv
from fleetspec.remote import facts
from fleetspec.remote.facts import (disk, gpu, model_config, release_state, server_info, sglang, systemd,
                                    torch, unit_files, unitfile)
from fleetspec.remote.transport import Transport

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SYSTEMD = FIX / "systemd" / "252-source-derived"
CT129 = ("/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3.6-27B "
         "--port 30000 --host 0.0.0.0 --tp-size 2 --mem-fraction-static 0.88 --context-length 131072 "
         "--max-running-requests 16 --mamba-full-memory-ratio 0.5 --mamba-scheduler-strategy extra_buffer "
         "--reasoning-parser qwen3 --tool-call-parser qwen3_coder --speculative-algo NEXTN "
         "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4").split()


def test_systemd_show_active_ct129():
    unit = systemd.parse((SYSTEMD / "show-ct129-active.txt").read_text(), service="sglang-qwen.service")
    assert (unit.load_state, unit.active_state, unit.sub_state) == ("loaded", "active", "running")
    assert unit.main_pid == 48213 and unit.n_restarts == 0 and unit.result == "success"
    assert unit.fragment_path == "/etc/systemd/system/sglang-qwen.service" and unit.unit_file_state == "enabled"
    assert unit.dropin_paths[1].endswith("50-fleetspec.conf")
    assert unit.environment == {"CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_ENABLE_JIT_DEEPGEMM": "0"}
    [ex] = unit.exec_start
    assert ex.path == "/root/ml-env/bin/python3" and ex.pid == 48213 and not ex.ignore_errors
    assert list(ex.argv) == CT129
    assert speculative_algorithm_from_argv(unit.argv) == "NEXTN"
    assert ex.start_time == "Mon 2026-11-30 09:12:01 UTC" and ex.stop_time is None


def test_systemd_show_crashed_and_not_found():
    unit = systemd.parse((SYSTEMD / "show-crashed.txt").read_text())
    assert unit.active_state == "activating" and unit.sub_state == "auto-restart" and unit.n_restarts == 4
    assert unit.exec_start[0].code == "exited" and unit.exec_start[0].status == "1" and unit.dropin_paths == []
    gone = systemd.parse((SYSTEMD / "show-not-found.txt").read_text())
    assert gone.load_state == "not-found" and not gone.found and gone.fragment_path is None and gone.argv is None
    assert not systemd.parse(systemd.NO_SYSTEMCTL + "\n").available


def test_systemd_exec_value_with_semicolons_and_quoted_lists():
    ex = systemd.parse_exec("{ path=/bin/sh ; argv[]=/bin/sh -c a ; b ; ignore_errors=yes ; start_time=[n/a] ; "
                            "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")
    assert ex.argv == ("/bin/sh", "-c", "a", ";", "b") and ex.ignore_errors
    assert systemd.split_words('A=1 "B=two words" "C=q\\"\\\\\\$x\\n"') == ["A=1", "B=two words", 'C=q"\\$x\n']


def test_systemd_command_is_quoted():
    assert systemd.command("a b.service").endswith(" -- 'a b.service'")     # `--`: a name is never an option
    assert "systemctl show -p ActiveState,SubState," in systemd.command("a b.service")


def test_unit_files_give_exact_argv():
    unit = "[Unit]\nDescription=x\n[Service]\nExecStart=/py -m sglang.launch_server --chat-template \"a b\" \\\n  --port 30000\n"
    dropin = "[Service]\nEnvironment=A=1\n"
    assert unitfile.effective_exec_start(unit, [dropin]) == [
        "/py", "-m", "sglang.launch_server", "--chat-template", "a b", "--port", "30000"]
    with pytest.raises(unitfile.UnitSyntaxError, match="exactly one"):
        unitfile.effective_exec_start(unit, ["[Service]\nExecStart=\n"])
    with pytest.raises(unitfile.UnitSyntaxError, match=r"\$VARIABLES"):
        unitfile.effective_exec_start("[Service]\nExecStart=/py $OPTS\n")


def test_unit_files_captured_on_the_lab():
    """`unit_files` on the lab's ct200 (real systemd 252, base64 from coreutils): the unit's bytes
    and the recorded baseline.json, which agree (status: no "unit edited by hand")."""
    from fleetspec.model.baseline import Baseline

    got = unit_files.parse((FIX / "systemd" / "252-lab" / "unit-files-ct200.txt").read_text())
    assert got.fragment_path == "/etc/systemd/system/sglang-qwen.service" and got.dropins == {}
    assert got.unit_bytes.startswith(b"[Unit]\n") and b"--speculative-algorithm DFLASH" in got.unit_bytes
    baseline = Baseline.from_json(got.baseline_json)
    assert baseline.differences(got.unit_bytes, got.dropins) == []
    assert baseline.differences(got.unit_bytes.replace(b"DFLASH", b"EAGLE"), {}) != []


def test_unit_files_keep_any_bytes_and_drop_in_order():
    raw = (b"[Service]\r\nEnvironment=A=%%\x00\n", b"no newline at the end")
    import base64

    out = ("fragment /etc/systemd/system/x.service\n"
           "dropin /etc/systemd/system/x.service.d/20-b.conf\ndropin /etc/systemd/system/x.service.d/10-a.conf\n"
           f"file /etc/systemd/system/x.service {base64.b64encode(raw[0]).decode()}\n"
           f"file /etc/systemd/system/x.service.d/20-b.conf {base64.b64encode(raw[1]).decode()}\n"
           f"file /etc/systemd/system/x.service.d/10-a.conf {base64.b64encode(b'').decode()}\n")
    got = unit_files.parse(out)
    assert got.unit_bytes == raw[0] and got.baseline_json is None
    assert list(got.dropins.items()) == [("/etc/systemd/system/x.service.d/20-b.conf", raw[1]),
                                         ("/etc/systemd/system/x.service.d/10-a.conf", b"")]
    assert unit_files.parse("fragment \n") == unit_files.UnitFiles(None, None)
    with pytest.raises(ValueError, match="not base64"):
        unit_files.parse("fragment /u\nfile /u @@@\n")


def test_gpu_csv_per_nvidia_docs():
    info = gpu.parse((FIX / "nvidia-smi" / "query-gpu.csv").read_text())
    assert info.present and len(info.gpus) == 3 and str(info) == "3 x NVIDIA H100 80GB HBM3"
    g0, _, g2 = info.gpus
    assert (g0.index, g0.memory_total_mib, g0.memory_used_mib, g0.utilization_pct, g0.temperature_c) == (0, 81559, 74122, 97, 63)
    assert g0.uuid.startswith("GPU-") and g2.utilization_pct is None and g2.temperature_c is None
    assert str(gpu.parse(gpu.NO_SMI + "\n")) == "no GPU"


def test_disk_df_posix():
    out = ("Filesystem        1-blocks         Used    Available Capacity Mounted on\n"
           "/dev/nvme0n1p2 1967317778432 812341231616 1055063601152      44% /\n")
    d = disk.parse(out, path="/var/lib/fleetspec")
    assert (d.filesystem, d.free_bytes, d.size_bytes, d.mount) == ("/dev/nvme0n1p2", 1055063601152, 1967317778432, "/")


def test_disk_command_on_this_machine(tmp_path):
    d = disk.parse(subprocess.run(["sh", "-c", disk.command(str(tmp_path / "not" / "yet"))], capture_output=True,
                                  text=True, check=True).stdout)
    assert d.free_bytes > 0


def test_model_config_hybrid():
    qwen36 = {"architectures": ["Qwen3_5ForConditionalGeneration"],
              "text_config": {"layer_types": ["linear_attention"] * 3 + ["full_attention"]}}
    m = model_config.parse(json.dumps(qwen36), path="/root/models/Qwen3.6-27B")
    assert m.found and m.is_hybrid and m.architectures == ["Qwen3_5ForConditionalGeneration"]
    dense = model_config.parse(json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36}))
    assert not dense.is_hybrid
    assert not model_config.parse(model_config.MISSING + "\n").found


def test_release_state_parse():
    # The current release is healthy; pruning an older one wrote the last status line.
    out = ("exists=yes\ncurrent=/var/lib/fleetspec/sglang-qwen/releases/20261130-0912-ddtree\nbaseline=yes\n"
           'ledger={"kind":"step","release":"20261130-0912-ddtree","name":"commit","state":"ok"}\n'
           'status={"kind":"status","release":"20261129-0800-nextn","name":"release","state":"pruned"}\n'
           'current_status={"kind":"status","release":"20261130-0912-ddtree","name":"release","state":"healthy"}\n'
           "lock=free\n")
    s = release_state.parse(out)
    assert s.managed and s.baseline and s.current == "20261130-0912-ddtree" and s.release_status == "healthy"
    assert s.interrupted is None and not s.locked
    empty = release_state.parse("exists=no\ncurrent=\nbaseline=no\nledger=\nstatus=\n")
    assert not empty.managed and empty.current is None and empty.last_entry is None


def test_server_info_parse():
    info = server_info.parse({"speculative_algorithm": "EAGLE", "version": "0.5.23",
                              "launch_command": "python3 -m sglang.launch_server --speculative-algo NEXTN",
                              "internal_states": [{"avg_spec_accept_length": 2.7}]})
    assert info.speculative_algorithm == "EAGLE" and info.avg_spec_accept_length == 2.7
    assert speculative_algorithm_from_argv(info.launch_command) == "NEXTN"


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.23"])
def test_record_trimmed_real(version):
    rec = sglang.parse_record((FIX / "sglang" / f"RECORD-{version}.trimmed").read_text())
    assert rec["sglang/srt/speculative/spec_info.py"].sha256 and rec["sglang/version.py"].size == 852
    assert rec[f"sglang-{version}.dist-info/RECORD"].sha256 is None
    if version == "0.5.13.post1":
        assert "sglang/srt/speculative/dflash_worker.py" in rec
    else:
        assert "sglang/srt/speculative/dflash_worker_v2.py" in rec and "sglang/srt/speculative/dflash_worker.py" not in rec


def _run_local(command, site):
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONNOUSERSITE="1")
    r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.23"])
def test_sglang_snippet_on_real_files(tmp_path, version):
    site = tmp_path / "site-packages"
    shutil.copytree(FIX / "sglang" / version / "site-packages", site)
    inst = sglang.parse(_run_local(sglang.command(sys.executable), site))
    assert inst.version == version and inst.pristine and inst.files_checked == 3
    assert Path(inst.site_packages) == site and inst.python_version == sys.version.split()[0]
    spec = site / "sglang/srt/speculative/spec_info.py"
    spec.write_text(spec.read_text() + "\n# patched by hand\n")
    (site / "sglang/version.py").unlink()
    inst = sglang.parse(_run_local(sglang.command(sys.executable), site))
    assert inst.drift == ["sglang/srt/speculative/spec_info.py"] and inst.missing == ["sglang/version.py"]
    assert not inst.pristine


def test_sglang_and_torch_missing():
    inst = sglang.parse(_run_local(sglang.command(sys.executable), "/nonexistent"))
    assert not inst.installed and "not installed" in inst.error
    compile(torch.SNIPPET, "torch-snippet", "exec")  # runs on hosts; parse its documented shape here
    tv = torch.parse('{"python_tag": "cp311", "version": "2.11.0+cu128", "cuda": "12.8", "cxx11_abi": true, '
                     '"cuda_available": true, "arch_list": ["sm_90"]}\n')
    assert (tv.version, tv.cuda, tv.cxx11_abi, tv.arch_list) == ("2.11.0+cu128", "12.8", True, ("sm_90",))
    cpu = torch.parse('{"python_tag": "cp311", "version": "2.13.0+cpu", "cuda": null, "cxx11_abi": true}')
    assert cpu.cuda is None and not cpu.cuda_available


def test_batch_framing_is_exact():
    class Echo:
        __name__ = "fleetspec.remote.facts.echo"

        @staticmethod
        def command(text):
            import shlex
            return f"printf %s {shlex.quote(text)}; printf err >&2; exit 0"

        @staticmethod
        def parse(stdout, text):
            return stdout

    token = "__T__"
    script = facts.build_batch([(Echo, {"text": "a\n\nb\n"}), (Echo, {"text": ""})], token)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout
    raws = facts.split_batch(out, token, 2)
    assert raws[0].stdout == "a\n\nb\n" and raws[0].stderr == "err" and raws[0].rc == 0
    assert raws[1].stdout == ""


def test_gather_many_one_round_trip(tmp_path, sshd, ssh_client_key, inventory_writer):
    host = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key)).hosts["h"]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"layer_types": ["mamba", "attention"]}))
    t = Transport(host)
    calls = []
    real = t.run_script
    t.run_script = lambda *a, **k: calls.append(a) or real(*a, **k)
    try:
        d, g, m, s, rs, bad = facts.gather_many(t, [
            (disk, {"path": str(tmp_path)}), (gpu, {}), (model_config, {"path": str(tmp_path / "model")}),
            (sglang, {"python": sys.executable}), (release_state, {"service": "sglang-test.service"}),
            (sglang, {"python": "/nonexistent/python3"})], timeout=60)
        assert len(calls) == 1
        assert d.free_bytes > 0 and not g.present and m.is_hybrid and not s.installed and not rs.managed
        assert bad is None
        keyed = facts.gather_many(t, {"gpu": (gpu, {}), "bad": (sglang, {"python": "/nonexistent/python3"})},
                                  errors="return")
        assert not keyed["gpu"].present and "fact sglang failed (rc=127)" in str(keyed["bad"])
        assert facts.gather(t, gpu).present is False
    finally:
        t.close()


def test_release_state_flags_interrupted_deploys_unless_locked():
    switched = ("exists=yes\ncurrent=/var/lib/fleetspec/s/releases/R2\nbaseline=yes\n"
                'ledger={"kind":"step","release":"R2","name":"restart","state":"started"}\n'
                'status={"kind":"status","release":"R2","name":"release","state":"switched"}\n'
                'current_status={"kind":"status","release":"R2","name":"release","state":"switched"}\n')
    s = release_state.parse(switched + "lock=free\n")
    assert "R2 was interrupted after step restart while switched" in s.interrupted
    assert s.needs_rollback and "fleetspec" not in s.interrupted      # ops/status says what to run
    assert release_state.parse(switched + "lock=held\n").interrupted is None   # a live deploy
    early = ("exists=yes\ncurrent=\nbaseline=yes\n"
             'ledger={"kind":"step","release":"R3","name":"stage","state":"started"}\n'
             'status={"kind":"status","release":"R1","name":"release","state":"healthy"}\nlock=free\n')
    assert "died at step stage before switching" in release_state.parse(early).interrupted
    assert not release_state.parse(early).needs_rollback

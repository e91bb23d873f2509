"""Facts beyond their recorded cases (test_facts_cases.py): commands run here, sub-parsers, what\nops reads from parsed facts, and batching over a real sshd."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetspec import systemd_unit
from fleetspec.model.inventory import load_inventory
from fleetspec.ops.argv import speculative_algorithm_from_argv
from fleetspec.remote import facts
from fleetspec.remote.facts import disk, gpu, model_config, release_state, sglang, systemd, torch
from fleetspec.remote.transport import Transport
from tests.unit.test_facts_cases import load_case, parse_case

FIX = Path(__file__).resolve().parents[1] / "fixtures"
CT129 = ("/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3.6-27B "
         "--port 30000 --host 0.0.0.0 --tp-size 2 --mem-fraction-static 0.88 --context-length 131072 "
         "--max-running-requests 16 --mamba-full-memory-ratio 0.5 --mamba-scheduler-strategy extra_buffer "
         "--reasoning-parser qwen3 --tool-call-parser qwen3_coder --speculative-algo NEXTN "
         "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4").split()


def test_captured_argv_reads_as_the_launch_did():
    """The ct129 unit (source-derived case) and a /server_info body: ops reads the operator's NEXTN
    from the parsed argv, though sglang serves it as EAGLE."""
    unit = parse_case("systemd", load_case("systemd", "ct129-active-source-derived"))
    assert list(unit.argv) == CT129 and speculative_algorithm_from_argv(unit.argv) == "NEXTN"
    info = parse_case("server_info", load_case("server_info", "nextn-served-as-eagle"))
    assert info.speculative_algorithm == "EAGLE" and speculative_algorithm_from_argv(info.launch_command) == "NEXTN"


def test_unit_files_captured_on_the_lab_agree_with_their_baseline():
    """`unit_files` on the lab's ct200: the unit's bytes and the recorded baseline.json agree (status:
    no "unit edited by hand"); an edit shows."""
    from fleetspec.model.baseline import Baseline

    got = parse_case("unit_files", load_case("unit_files", "ct200-lab"))
    baseline = Baseline.from_json(got.baseline_json)
    assert baseline.differences(got.unit_bytes, got.dropins) == []
    assert baseline.differences(got.unit_bytes.replace(b"DFLASH", b"EAGLE"), {}) != []


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
    assert list(systemd_unit.effective_exec_command(unit, [dropin]).argv) == [
        "/py", "-m", "sglang.launch_server", "--chat-template", "a b", "--port", "30000"]
    with pytest.raises(systemd_unit.UnitSyntaxError, match="exactly one"):
        systemd_unit.effective_exec_command(unit, ["[Service]\nExecStart=\n"])
    with pytest.raises(systemd_unit.UnitSyntaxError, match=r"\$VARIABLES"):
        systemd_unit.effective_exec_command("[Service]\nExecStart=/py $OPTS\n")


def test_disk_command_on_this_machine(tmp_path):
    d = disk.parse(subprocess.run(["sh", "-c", disk.command(str(tmp_path / "not" / "yet"))], capture_output=True,
                                  text=True, check=True).stdout)
    assert d.free_bytes > 0


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
    compile(torch.SNIPPET, "torch-snippet", "exec")  # runs on hosts; its output's cases: fixtures/facts/torch


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


def test_a_prestaged_release_waiting_for_its_deploy_is_not_a_deploy_that_died():
    """The lines a prestage writes (model.ledger's own serialisation): its stage ok, then status
    staged with prestage. Only while nothing follows is it "prestaged"; a deploy that took it and
    died after (its own step line last) or wrote its own `staged` is the usual interrupted note."""
    from fleetspec.model import ledger as L

    staged = L.Entry.status("R4", L.STAGED, prestage=True).to_line()
    head = "exists=yes\ncurrent=/var/lib/fleetspec/s/releases/R1\nbaseline=yes\n"
    waiting = release_state.parse(head + f"ledger={staged}\nstatus={staged}\nlock=free\n")
    assert (waiting.prestaged, waiting.interrupted, waiting.needs_rollback) == ("R4", None, False)
    assert release_state.parse(head + f"ledger={staged}\nstatus={staged}\nlock=held\n").prestaged is None
    took = L.Entry.step("R4", "render", L.StepState.STARTED).to_line()
    died = release_state.parse(head + f"ledger={took}\nstatus={staged}\nlock=free\n")
    assert died.prestaged is None and "R4 died after step render before switching" in died.interrupted
    own = L.Entry.status("R4", L.STAGED).to_line()
    died = release_state.parse(head + f"ledger={own}\nstatus={own}\nlock=free\n")
    assert died.prestaged is None and "R4 died" in died.interrupted


def test_a_release_staged_ahead_names_its_algo_until_a_deploy_takes_it():
    """`deploy --stage-only` writes status staged with ahead and its algo: status says which deploy
    switches to it; a plain prestage names no algo; once a deploy writes after it, it is neither."""
    from fleetspec.model import ledger as L

    ahead = L.Entry.status("R5", L.STAGED, ahead=True, algo="ddtree").to_line()
    head = "exists=yes\ncurrent=\nbaseline=yes\n"
    waiting = release_state.parse(head + f"ledger={ahead}\nstatus={ahead}\nlock=free\n")
    assert (waiting.prestaged, waiting.staged_ahead, waiting.interrupted) == ("R5", "ddtree", None)
    pre = L.Entry.status("R4", L.STAGED, prestage=True).to_line()
    assert release_state.parse(head + f"ledger={pre}\nstatus={pre}\nlock=free\n").staged_ahead is None
    took = L.Entry.step("R5", "render", L.StepState.STARTED).to_line()
    died = release_state.parse(head + f"ledger={took}\nstatus={ahead}\nlock=free\n")
    assert (died.prestaged, died.staged_ahead) == (None, None) and "R5 died" in died.interrupted


def test_the_ledger_lists_releases_staged_ahead_until_used_or_abandoned():
    from fleetspec.model import ledger as L

    lines = [L.Entry.status("20261203T100000Z-ddtree-aaaa", L.STAGED, ahead=True, algo="ddtree"),
             L.Entry.status("20261203T110000Z-ddtree-bbbb", L.STAGED, ahead=True, algo="ddtree"),
             L.Entry.status("20261203T103000Z-dflash-cccc", L.STAGED, ahead=True, algo="dflash"),
             L.Entry.status("20261203T120000Z-ddtree-dddd", L.STAGED, prestage=True),
             L.Entry.status("20261203T090000Z-ddtree-eeee", L.STAGED, ahead=True, algo="ddtree"),
             L.Entry.status("20261203T090000Z-ddtree-eeee", L.FAILED, reason="superseded")]
    parsed = L.parse("\n".join(e.to_line() for e in lines) + "\n")
    assert parsed.staged_ahead("ddtree") == ["20261203T100000Z-ddtree-aaaa", "20261203T110000Z-ddtree-bbbb"]
    assert parsed.staged_ahead("nextn") == []
    assert len(parsed.staged_ahead()) == 3

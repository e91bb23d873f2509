"""Launch forms, the parser-table split, prefixes, drop-in order and the speculative environment.

The option tables used here are the packaged ones, which test_launch_corpus.py proves equal to the
real parsers; every expectation below was checked against sglang's own parser there or by hand.
"""

from __future__ import annotations

import pytest

from fleetspec import systemd_unit
from fleetspec.errors import UserError
from fleetspec.model import launch
from fleetspec.model.playbook import load_playbook
from fleetspec.ops import argv as argv_ops
from fleetspec.ops.activation import exec_start_mismatch
from fleetspec.ops.flags import Flags
from fleetspec.ops.hoststate import DROPIN_NAME, is_ours, sorts_after_ours
from fleetspec.remote.facts import systemd as systemd_fact

T23 = launch.load_table("0.5.23")
T13 = launch.load_table("0.5.13.post1")
PY = "/opt/venv/bin/python3"
FLAGS = ["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "64"]


def form(words: str, prefix: str = "", path: str | None = None) -> launch.LaunchForm:
    return launch.classify(words.split(), path=path, prefix=prefix)


# Classification ---------------------------------------------------------------------------------
@pytest.mark.parametrize("words,kind,start", [
    (f"{PY} -m sglang.launch_server --port 1", launch.LAUNCH_SERVER, 3),
    (f"{PY} -u -m sglang.launch_server --port 1", launch.LAUNCH_SERVER, 4),
    (f"{PY} -um sglang.launch_server --port 1", launch.LAUNCH_SERVER, 3),
    (f"{PY} -msglang.launch_server --port 1", launch.LAUNCH_SERVER, 2),
    (f"{PY} -X faulthandler -W ignore -m sglang.launch_server", launch.LAUNCH_SERVER, 7),
    ("python3.11 -B -m sglang.launch_server", launch.LAUNCH_SERVER, 4),
    ("/opt/venv/bin/sglang serve --model-path m", launch.SERVE, 2),
    ("/opt/venv/bin/sglang serve m --port 1", launch.SERVE, 2),
    (f"/usr/bin/env A=1 B=2 {PY} -m sglang.launch_server --port 1", launch.LAUNCH_SERVER, 6),
])
def test_supported_forms(words, kind, start):
    f = form(words)
    assert (f.form, f.start) == (kind, start)
    assert f.head == words.split()[:start]


@pytest.mark.parametrize("words,named", [
    ("/bin/bash -c 'python3 -m sglang.launch_server'", "shell wrapper"),
    ("/bin/sh -lc x", "shell wrapper"),
    ("/usr/bin/docker run --gpus all -m 900g img python3 -m sglang.launch_server", "container runtime"),
    ("/usr/bin/podman run img python3 -m sglang.launch_server", "container runtime"),
    ("/usr/local/bin/nerdctl run img", "container runtime"),
    ("/usr/bin/kubectl exec pod -- python3 -m sglang.launch_server", "container runtime"),
    ("/usr/local/bin/docker-compose up", "container runtime"),
    (f"{PY} -m vllm.entrypoints.openai.api_server --model m", "python -m vllm.entrypoints.openai.api_server"),
    (f"{PY} -m sglang_router.launch_server --model-path m", "python -m sglang_router.launch_server"),
    (f"{PY} /opt/start_server.py --model-path m", "a python script"),
    (f"{PY} -c 'import sglang'", "python -c"),
    (f"{PY} -I -m sglang.launch_server", "python -I"),
    (f"{PY} -E -m sglang.launch_server", "python -E"),
    ("/opt/run-sglang.sh --model-path m", "unknown executable"),
    ("/usr/bin/numactl --cpunodebind=0 python3 -m sglang.launch_server", "wrapper program (numactl)"),
    ("/opt/venv/bin/sglang generate --model-path m", "`sglang generate`"),
    ("/usr/bin/env -i python3 -m sglang.launch_server", "`env` wrapper with options"),
])
def test_refused_forms_name_the_form_and_the_way_out(words, named):
    with pytest.raises(launch.LaunchRefused) as err:
        launch.classify(words.split() if "'" not in words else _shellish(words))
    assert named in str(err.value)
    assert isinstance(err.value, UserError) and err.value.exit_code == 2


def _shellish(words):
    return systemd_unit.parse_exec(words)[0].argv


def test_at_prefix_identity_comes_from_the_path_not_argv0():
    f = form("sglang-r1 -m sglang.launch_server --port 1", prefix="-@", path="/opt/venv/bin/python")
    assert f.form == launch.LAUNCH_SERVER and f.path == "/opt/venv/bin/python" and f.prefix == "-@"
    with pytest.raises(launch.LaunchRefused, match="shell wrapper"):
        launch.classify(["python3", "-c", "x"], path="/bin/bash", prefix="@")


# The split: dests from the real parser ---------------------------------------------------------------
def test_unique_prefix_alias_and_equals_forms_are_one_group():
    f = form(f"{PY} -m sglang.launch_server --model-path m --speculative-algo=EAGLE --port 30000 "
             f"--speculative-draft-model d --speculative-num-st 3 --host h")
    d = launch.derive(f, T23, FLAGS)
    assert d.dropped == [["--speculative-algo=EAGLE"], ["--speculative-draft-model", "d"], ["--speculative-num-st", "3"]]
    assert d.argv == [PY, "-m", "sglang.launch_server", "--model-path", "m", *FLAGS, "--port", "30000", "--host", "h"]
    assert d.algorithm == "EAGLE"


def test_negated_speculative_option_is_in_the_group_by_dest():
    """`--no-speculative-…` does not start with --speculative; its dest does (0.5.23)."""
    f = form(f"{PY} -m sglang.launch_server --model-path m --no-speculative-enable-w4a4-mxfp4-megamoe --port 1")
    d = launch.derive(f, T23, FLAGS)
    assert d.dropped == [["--no-speculative-enable-w4a4-mxfp4-megamoe"]]
    assert "--no-speculative-enable-w4a4-mxfp4-megamoe" not in d.argv


def test_a_value_that_looks_speculative_is_not_an_option():
    f = form(f"{PY} -m sglang.launch_server --model-path m --served-model-name --speculative-x=1")
    with pytest.raises(launch.LaunchRefused, match="lacks its value|does not know"):
        launch.derive(f, T23, FLAGS)     # argparse refuses it too: the name takes no option-like word
    f = form(f"{PY} -m sglang.launch_server --model-path m --served-model-name=--speculative-algorithm")
    assert launch.derive(f, T23, FLAGS).kept[-1] == ["--served-model-name=--speculative-algorithm"]


def test_carried_draft_runtime_options_stay_unless_the_playbook_sets_them():
    f = form(f"{PY} -m sglang.launch_server --model-path m --speculative-algorithm DFLASH "
             f"--speculative-draft-attention-backend fa4 --speculative-moe-runner-backend=triton --port 1")
    d = launch.derive(f, T13, FLAGS, carry=("--speculative-draft-attention-backend", "speculative_moe_runner_backend"))
    assert d.carried == [["--speculative-draft-attention-backend", "fa4"], ["--speculative-moe-runner-backend=triton"]]
    assert d.dropped == [["--speculative-algorithm", "DFLASH"]]
    d = launch.derive(f, T13, [*FLAGS, "--speculative-draft-attention-backend", "triton"],
                      carry=("--speculative-draft-attention-backend",))
    assert ["--speculative-draft-attention-backend", "fa4"] in d.dropped


def test_parser_refusals_are_refusals_here_too():
    for words, why in [("--model-path m --speculative-draft x", "ambiguous"),
                       ("--model-path m --enable-kvstore", "does not know"),
                       ("--model-path m stray", "stray word"),
                       ("--model-path m --trust-remote-code=yes", "takes no value"),
                       ("--model-path m --port", "lacks its value"),
                       ("--port 1", "without the model_path"),
                       ("--model-path m --config /etc/x.yaml", "--config FILE")]:
        with pytest.raises(launch.LaunchRefused, match=why):
            launch.derive(form(f"{PY} -m sglang.launch_server {words}"), T23, FLAGS)


def test_serve_form_slices_exactly_what_the_entry_point_parses():
    f = form("/v/bin/sglang serve /models/q --model-type llm --port 1 --speculative-algorithm EAGLE")
    new = launch.derive(f, T23, FLAGS, version="0.5.23").argv
    assert new == ["/v/bin/sglang", "serve", "/models/q", "--model-type", "llm", "--port", "1", *FLAGS]
    assert launch.parsed_args(f, new, "0.5.23") == ["--model-path", "/models/q", "--port", "1", *FLAGS]
    f = form("/v/bin/sglang serve --model-path q --port 1")
    assert launch.parsed_args(f, f.argv, "0.5.13.post1") == ["--model-path", "q", "--port", "1"]
    with pytest.raises(launch.LaunchRefused, match="stray word"):   # 0.5.13.post1's serve has no positional
        launch.derive(form("/v/bin/sglang serve q --port 1"), T13, FLAGS, version="0.5.13.post1")
    with pytest.raises(launch.LaunchRefused, match="model-type diffusion") as refused:
        launch.derive(form("/v/bin/sglang serve --model-path q --model-type diffusion"), T23, FLAGS)
    assert "sglang serve …" not in refused.value.advice      # never the form it refused as the way out
    g = form(f"{PY} -u -m sglang.launch_server --model-path q")
    assert launch.parsed_args(g, g.argv, "0.5.23") == ["--model-path", "q"]


# Prefixes: rendered, parsed back by fleetspec's systemd parser, byte-exact --------------------------------
@pytest.mark.parametrize("prefix", ["", "-", "+", "!", "!!", ":", "-@", "@", "-:", "@+", "-!!"])
def test_prefixes_round_trip(prefix):
    argv = ["sglang-r1" if "@" in prefix else PY, "-m", "sglang.launch_server", "--served-model-name", "a b$c%d",
            "--model-path", "/m"]
    path = PY if "@" in prefix else None
    line = systemd_unit.exec_line(argv, prefix, path)
    assert line.startswith(prefix + (PY if path else argv[0]))
    back = systemd_unit.effective_exec_command(f"[Service]\nExecStart={line}\n")
    assert back.flags == prefix and back.path == PY and list(back.argv) == argv


def test_at_line_keeps_path_and_argv0():
    line = systemd_unit.exec_line(["sglang-r1", "-m", "sglang.launch_server"], "-@", "/opt/venv/bin/python")
    assert line == "-@/opt/venv/bin/python sglang-r1 -m sglang.launch_server"


def test_colon_prefix_keeps_dollar_as_written():
    unit = "[Service]\nExecStart=:/opt/venv/bin/python -m sglang.launch_server --served-model-name q$$x --model-path $HOME\n"
    cmd = systemd_unit.effective_exec_command(unit)
    assert cmd.argv[-3:] == ("q$$x", "--model-path", "$HOME")    # no expansion under ':'
    assert systemd_unit.effective_exec_command(f"[Service]\nExecStart={systemd_unit.exec_line(cmd.argv, ':')}\n") == cmd


# Drop-in order and the check after daemon-reload -------------------------------------------------------
def test_dropin_sorts_after_admin_names():
    assert DROPIN_NAME == "zz-fleetspec.conf"
    for admin in ("override.conf", "50-x.conf", "99-last.conf", "zz-admin.conf", "Z.conf"):
        assert not sorts_after_ours(f"/etc/systemd/system/s.service.d/{admin}")
        assert sorted([admin, DROPIN_NAME])[-1] == DROPIN_NAME
    assert sorts_after_ours("/etc/systemd/system/s.service.d/zzz.conf")
    assert is_ours("/etc/systemd/system/s.service.d/50-fleetspec.conf") and is_ours(f"/x/{DROPIN_NAME}")


def test_exec_start_after_reload_must_equal_the_derived_one():
    argv = [PY, "-m", "sglang.launch_server", "--model-path", "/m", "--served-model-name", "cost$1"]
    shown = "ExecStart={ path=%s ; argv[]=%s ; ignore_errors=yes ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
    ok = systemd_fact.parse(shown % (PY, " ".join(argv[:-1] + ["cost$$1"]))).exec_start
    assert exec_start_mismatch(ok, argv, "-") is None
    old = systemd_fact.parse(shown % (PY, f"{PY} -m sglang.launch_server --model-path /m --speculative-algorithm EAGLE")).exec_start
    assert "argv is" in exec_start_mismatch(old, argv, "-")
    assert "ignore_errors=yes" in exec_start_mismatch(ok, argv, "")
    assert "2 ExecStart" in exec_start_mismatch(ok + ok, argv, "-")


# Environment ---------------------------------------------------------------------------------------------
def test_speculation_only_environment_is_listed_and_unset(tmp_path):
    playbook = load_playbook(__import__("pathlib").Path(__file__).parents[2] / "playbooks" / "ddtree.yaml")
    f = form(f"{PY} -m sglang.launch_server --model-path m --speculative-algorithm EAGLE")
    env = {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_SIMULATE_ACC_LEN": "3", "HF_HOME": "/h", "SGLANG_DDTREE_LOG": "1"}
    plan = argv_ops.plan_launch(f, T23, Flags(FLAGS), playbook, "0.5.23", env, "h: s")
    assert set(plan.env_dropped) == {"SGLANG_ENABLE_SPEC_V2", "SGLANG_SIMULATE_ACC_LEN"}
    assert plan.env_kept == ("SGLANG_DDTREE_LOG",)          # the playbook sets it itself
    assert plan.simulated == ("SGLANG_SIMULATE_ACC_LEN",)
    assert any("inconclusive" in n for n in plan.notes)
    d = plan.to_dict()
    assert d["dropped"] == [["--speculative-algorithm", "EAGLE"]] and d["added"] == FLAGS and d["form"]
    g = form(f"/usr/bin/env SGLANG_ENABLE_SPEC_V2=1 {PY} -m sglang.launch_server --model-path m")
    with pytest.raises(UserError, match="through `env`"):
        argv_ops.plan_launch(g, T23, Flags(FLAGS), playbook, "0.5.23", {}, "h: s")


@pytest.mark.parametrize("table, version, extra, running", [
    (T13, "0.5.13.post1", "--max-running-requests 16", 16),
    (T23, "0.5.23", "--max-running-requests=32", 32),
    (T23, "0.5.23", "", None),
])
def test_the_serving_concurrency_is_the_baselines_max_running_requests(table, version, extra, running):
    """Read with the real parser's table (either spelling), for the throughput gate's serving level."""
    playbook = load_playbook(__import__("pathlib").Path(__file__).parents[2] / "playbooks" / "ddtree.yaml")
    f = form(f"{PY} -m sglang.launch_server --model-path m {extra} --speculative-algorithm EAGLE".replace("  ", " "))
    assert argv_ops.plan_launch(f, table, Flags(FLAGS), playbook, version, {}, "h: s").max_running == running


def _preflight(form_, new_argv, launch_dict):
    from pathlib import Path
    from types import SimpleNamespace

    from fleetspec.model.release import Release
    from fleetspec.ops.preflight_result import Preflight

    root = Path(__file__).parents[2]
    playbook = load_playbook(root / "playbooks" / "ddtree.yaml")
    pf = Preflight(host=SimpleNamespace(name="h"), root=root, playbook=playbook, service="sglang-x.service",
                   python=PY, unit=None, unit_bytes=b"", dropins={}, exec_argv=list(form_.argv),
                   sglang=SimpleNamespace(version="0.5.23"), torch=None, hybrid=False, options=None,
                   new_argv=new_argv, patchset=None, kernels=[], form=form_, launch=None)
    release = Release(id="r1", host="h", service=pf.service, algo="ddtree", mode="release", sglang_version="0.5.23",
                      argv=new_argv, previous="baseline", exec_prefix=pf.exec_prefix, exec_path=pf.exec_path,
                      launch=launch_dict)
    return pf, release


def test_rendered_dropin_keeps_prefix_path_and_unsets_speculation_env():
    """The drop-in as systemd reads it after the unit: the derived command with `-@`, its
    executable and argv[0] kept; the dropped speculation-only variables unset."""
    from fleetspec.ops.rendering import dropin_text

    unit = ("[Service]\nEnvironment=SGLANG_ENABLE_SPEC_V2=1\n"
            "ExecStart=-@/opt/venv/bin/python sglang-r1 -m sglang.launch_server --model-path /m "
            "--speculative-algorithm EAGLE --served-model-name 50%%$$x\n")
    cmd = systemd_unit.effective_exec_command(unit)
    f = launch.classify(list(cmd.argv), path=cmd.path, prefix=cmd.flags)
    d = launch.derive(f, T23, FLAGS)
    pf, release = _preflight(f, d.argv, {"env_dropped": ["SGLANG_ENABLE_SPEC_V2"]})
    text = dropin_text(pf, release)
    assert "UnsetEnvironment=SGLANG_ENABLE_SPEC_V2" in text
    got = systemd_unit.effective_exec_command(unit, [text])
    assert (got.flags, got.path, list(got.argv)) == ("-@", "/opt/venv/bin/python", d.argv)
    assert d.argv[:4] == ["sglang-r1", "-m", "sglang.launch_server", "--model-path"]


def test_dropin_order_is_checked_at_preflight():
    from types import SimpleNamespace

    from fleetspec.ops.preflight_checks import check_dropin_order

    host = SimpleNamespace(name="h")
    ok = SimpleNamespace(dropin_paths=["/etc/systemd/system/s.d/override.conf", f"/etc/systemd/system/s.d/{DROPIN_NAME}"])
    check_dropin_order(ok, host, "s")
    late = SimpleNamespace(dropin_paths=["/etc/systemd/system/s.d/zzz-local.conf"])
    with pytest.raises(UserError, match="zzz-local.conf sorts after fleetspec's"):
        check_dropin_order(late, host, "s")


def test_admin_exec_start_dropins_are_reported_and_legacy_name_noted():
    from types import SimpleNamespace

    from fleetspec.ops.preflight_checks import admin_exec_start_dropins
    from fleetspec.ops.status import _dropin_notes

    d = "/etc/systemd/system/s.service.d"
    unit = SimpleNamespace(dropin_paths=[f"{d}/10-env.conf", f"{d}/override.conf", f"{d}/{DROPIN_NAME}"])
    texts = ["[Service]\nEnvironment=A=1\n", "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m x\n"]
    assert admin_exec_start_dropins(unit, texts) == [f"{d}/override.conf"]
    host = SimpleNamespace(name="h")
    notes = _dropin_notes(host, [f"{d}/50-fleetspec.conf", f"{d}/zzz.conf", f"{d}/override.conf"])
    assert len(notes) == 2 and "old name" in notes[0] and "zzz.conf sorts after" in notes[1]


def test_baseline_environment_comes_from_the_unit_files_not_from_fleetspecs_dropin():
    unit = ('[Service]\nEnvironment=A=1 "SGLANG_ENABLE_SPEC_V2=1" B=5%%\nEnvironment=C=3\n')
    admin = "[Service]\nUnsetEnvironment=C\nEnvironment=SGLANG_SIMULATE_ACC_LEN=2\n"
    assert systemd_unit.effective_environment(unit, [admin]) == {"A": "1", "SGLANG_ENABLE_SPEC_V2": "1", "B": "5%",
                                                             "SGLANG_SIMULATE_ACC_LEN": "2"}
    assert systemd_unit.effective_environment(unit, ["[Service]\nEnvironment=\n"]) == {}


def test_simulated_acceptance_makes_every_gate_inconclusive_and_blocking():
    from fleetspec.ops.gates import INCONCLUSIVE, PASS, Verdict, fail_closed_if_simulated

    verdicts = [Verdict("acceptance", PASS), Verdict("throughput", PASS, dry_run=True), Verdict("parity", PASS)]
    assert fail_closed_if_simulated(verdicts, ()) == verdicts
    out = fail_closed_if_simulated(verdicts, ("SGLANG_SIMULATE_ACC_LEN",))
    assert [v.verdict for v in out] == [INCONCLUSIVE] * 3 and all(v.blocks for v in out)
    assert "SGLANG_SIMULATE_ACC_LEN" in out[0].reason


def test_rendered_dropin_gives_the_engine_time_to_drain_on_sigterm():
    """TimeoutStopSec: derived from the launch's --context-length at stop.min_decode_tps (32768 /
    30 tok/s + 25 s of sglang's SIGTERM polls and scheduler exit), or the playbook's stop.timeout."""
    import dataclasses

    from fleetspec.model.bake import StopSpec
    from fleetspec.ops.rendering import dropin_text

    unit = "[Service]\nExecStart=/opt/venv/bin/python -m sglang.launch_server --model-path /m --context-length 32768\n"
    cmd = systemd_unit.effective_exec_command(unit)
    f = launch.classify(list(cmd.argv), path=cmd.path, prefix=cmd.flags)
    d = launch.derive(f, T23, FLAGS)
    pf, release = _preflight(f, d.argv, {})
    assert "TimeoutStopSec=1117\n" in dropin_text(pf, release)
    pf.playbook = dataclasses.replace(pf.playbook, stop=StopSpec(timeout=90))
    assert "TimeoutStopSec=90\n" in dropin_text(pf, release)
    no_length = [w for w in d.argv if w not in ("--context-length", "32768")]
    pf2, release2 = _preflight(f, no_length, {})
    assert "TimeoutStopSec=600\n" in dropin_text(pf2, release2)


def test_a_playbook_with_a_bake_adds_enable_metrics_where_the_baseline_lacks_it():
    """The bake reads the engine's own /metrics: --enable-metrics joins the new launch (and the
    plan says so), once, in both sglang versions' real parser tables."""
    import dataclasses
    from pathlib import Path

    from fleetspec.model.bake import BakeSpec

    playbook = dataclasses.replace(load_playbook(Path(__file__).parents[2] / "playbooks" / "ddtree.yaml"),
                                   bake=BakeSpec())
    for version in ("0.5.13.post1", "0.5.23"):
        table = launch.load_table(version)
        plan = argv_ops.plan_launch(form(f"{PY} -m sglang.launch_server --model-path m"), table, Flags(FLAGS),
                                    playbook, version, {}, "h: s")
        assert plan.derived.argv.count("--enable-metrics") == 1 and "--enable-metrics" in plan.to_dict()["added"]
        assert any("--enable-metrics added" in n for n in plan.notes)
        kept = argv_ops.plan_launch(form(f"{PY} -m sglang.launch_server --model-path m --enable-metrics"), table,
                                    Flags(FLAGS), playbook, version, {}, "h: s")
        assert kept.derived.argv.count("--enable-metrics") == 1 and not any("--enable-metrics" in n
                                                                              for n in kept.notes)
    plain = argv_ops.plan_launch(form(f"{PY} -m sglang.launch_server --model-path m"), T23, Flags(FLAGS),
                                 dataclasses.replace(playbook, bake=None), "0.5.23", {}, "h: s")
    assert "--enable-metrics" not in plain.derived.argv

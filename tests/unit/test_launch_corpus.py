"""The corpus of real launch configurations (tests/fixtures/execstart_corpus.yaml), each run through
classify -> derive -> render -> fleetspec's unit parser -> the real parser of each sglang version.

A case is either moved exactly (the rendered ExecStart parses back to the derived argv byte for byte,
prefix and executable kept; every non-speculative dest of the real parser unchanged; the speculative
group replaced; the algorithm read as the operator wrote it) or refused with the reason named.
The real parsers run once per version, all cases batched in one subprocess.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetspec import systemd_unit
from fleetspec.lab.envs import SGLANG_VERSIONS
from fleetspec.model import container_compose, container_launch, launch
from fleetspec.model.container_compose import ComposeUp
from fleetspec.remote.facts import execenv
from fleetspec.remote.facts.execenv import HostEnv

CORPUS = yaml.safe_load((Path(__file__).parents[1] / "fixtures" / "execstart_corpus.yaml").read_text())
FLAGS = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/draft",
         "--speculative-num-draft-tokens", "16"]
CARRY = ("--speculative-draft-attention-backend", "--speculative-moe-runner-backend", "--speculative-moe-a2a-backend")

# The parser exactly as prepare_server_args builds it; each argv parsed on its own, errors kept.
REAL_PARSE = r'''
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
out = []
for argv in json.loads(sys.stdin.read()):
    p = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(p)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = p.parse_args(argv)
        out.append({"ok": True, "ns": {k: repr(v) for k, v in vars(ns).items()}})
    except SystemExit:
        out.append({"ok": False, "error": (err.getvalue().strip().splitlines() or ["exit"])[-1]})
sys.stdout.write("\nREAL " + json.dumps(out) + "\n")
'''


def _expect(case, version):
    return (case.get("per_version") or {}).get(version, case["expect"])


def _command(case):
    """The ExecStart the process gets; a unit with $VARIABLES reads the case's environment files."""
    env = HostEnv(files={p: ((p, t.encode()),) for p, t in (case.get("env_files") or {}).items()}, manager={})
    return execenv.effective_exec_command(case["unit"], env=env)


def _classify(command):
    """The launch form, the container run (its engine command is what moves), or a compose up."""
    return container_compose.classify_exec(list(command.argv), path=command.path, prefix=command.flags)


def _environment(case) -> dict:
    return systemd_unit.effective_environment(case["unit"])


def test_corpus_is_real_and_large_enough():
    assert len(CORPUS) >= 30
    ids = [c["id"] for c in CORPUS]
    assert len(set(ids)) == len(ids)
    for case in CORPUS:
        assert case.get("source") and case.get("kind"), case["id"]
    moved = [c for c in CORPUS if c["expect"] == "moved"]
    refused = [c for c in CORPUS if c["expect"] != "moved"]
    assert len(moved) >= 15 and len(refused) >= 8
    # containers are read now (their engine command moves); units with $VARIABLES deploy
    assert not [c for c in CORPUS if "container runtime" in c["expect"]]
    assert len([c for c in moved if c.get("container")]) >= 2 and len([c for c in moved if c.get("env_files")]) >= 2


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_classify(case):
    """Version-independent: the launch form, or the refusal naming the form."""
    command = _command(case)
    try:
        form = _classify(command)
    except launch.LaunchRefused as err:
        expect = case["expect"]
        assert expect.startswith("refused:"), f"{case['id']} refused: {err}"
        # refusals by form name it; parser-level refusals come later (classify passes them)
        assert expect.split(":", 1)[1].strip() in str(err), str(err)
        return
    if isinstance(form, ComposeUp):
        assert case["expect"] == "compose up" and list(form.files) == case["compose_files"], case["id"]
        return
    assert form.prefix == command.flags and form.path == command.path
    if isinstance(form, container_launch.ContainerRun):
        assert case.get("container") == form.runtime, case["id"]
        assert form.argv == command.argv
        return
    assert "container" not in case, case["id"]
    assert form.argv[:form.start] == command.argv[:form.start]


def _derive_all(version, table):
    """(case, form, derived | LaunchRefused, host) for every case that classifies; for a container
    the form is the engine command inside and `host` the re-emitted runtime argv."""
    out = []
    for case in CORPUS:
        command = _command(case)
        try:
            got = _classify(command)
        except launch.LaunchRefused:
            continue
        if isinstance(got, ComposeUp):
            continue
        form, host = (got.engine, got) if isinstance(got, container_launch.ContainerRun) else (got, None)
        try:
            if host is not None:
                whole = container_launch.derive(host, table, FLAGS, carry=CARRY, version=version)
                derived, host = whole.engine, (host, whole.argv)
            else:
                derived = launch.derive(form, table, FLAGS, carry=CARRY, version=version)
        except launch.LaunchRefused as err:
            derived = err
        out.append((case, form, derived, host))
    return out


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_corpus_round_trips_through_real_parser(version):
    from fleetspec.lab.envs import local_env

    python = str(local_env(version))
    table = launch.load_table(version)
    assert table is not None, f"no packaged option table for {version}"
    results = _derive_all(version, table)
    batch = [["--model-path", "/m", *FLAGS]]
    for _case, form, derived, _host in results:
        batch.append(launch.parsed_args(form, form.argv, version))
        if not isinstance(derived, launch.LaunchRefused):
            batch.append(launch.parsed_args(form, derived.argv, version))
    # one python: the option dump (is the packaged table the real parser's?) and every parse
    done = subprocess.run([python, "-c", launch.DUMP_SCRIPT + REAL_PARSE], input=json.dumps(batch),
                          capture_output=True, text=True, timeout=600, cwd="/")
    line = [x for x in done.stdout.splitlines() if x.startswith("REAL ")]
    assert line, done.stderr[-2000:]
    real = json.loads(line[-1][5:])
    reference = real.pop(0)
    assert reference["ok"], reference
    checked = {"moved": 0, "refused": 0}
    for case, form, derived, host in results:
        expect = _expect(case, version)
        before = real.pop(0)
        if isinstance(derived, launch.LaunchRefused):
            assert expect.startswith("refused:"), f"{case['id']} on {version}: refused ({derived}), expected moved"
            assert expect.split(":", 1)[1].strip() in str(derived), f"{case['id']}: {derived}"
            # a parser-level refusal: sglang itself refuses the baseline too (or it is --config)
            assert not before["ok"] or "--config" in str(derived), f"{case['id']}: real parser accepts it"
            checked["refused"] += 1
            continue
        after = real.pop(0)
        assert expect == "moved", f"{case['id']} on {version}: moved, expected {expect}"
        _check_moved(case, form, derived, before, after, reference, version, host)
        checked["moved"] += 1
    assert not real
    assert checked["moved"] >= 15 and checked["refused"] >= 4, checked
    # The packaged table is the real parser's, not a stale copy.
    assert launch.parse_dump(done.stdout).to_dict() == table.to_dict()


def _check_moved(case, form, derived, before, after, reference, version, host=None):
    cid = f"{case['id']} on {version}"
    # render -> systemd's parse -> the process's argv: byte-exact, prefix and executable kept
    run, argv = host if host is not None else (form, derived.argv)
    line = systemd_unit.exec_line(argv, run.prefix, run.path if "@" in run.prefix else None)
    back = systemd_unit.effective_exec_command(f"[Service]\nExecStart=\nExecStart={line}\n")
    assert list(back.argv) == argv, cid
    assert back.flags == run.prefix and back.path == run.path, cid
    assert derived.argv[:form.start] == list(form.argv[:form.start]), cid
    if host is not None:        # every runtime word up to the image kept byte for byte
        assert argv[:run.image_at + 1] == list(run.argv[:run.image_at + 1]), cid
    assert before["ok"], f"{cid}: real parser refuses the baseline ({before['error']}) but fleetspec moved it"
    assert after["ok"], f"{cid}: real parser refuses the derived command: {after['error']}"
    old, new, ref = before["ns"], after["ns"], reference["ns"]
    carried = {d for d in ("speculative_draft_attention_backend", "speculative_moe_runner_backend",
                           "speculative_moe_a2a_backend")}
    for dest in set(old) | set(new):
        if dest.startswith(launch.SPEC_DEST_PREFIX):
            want = old[dest] if dest in carried else ref[dest]
            assert new[dest] == want, f"{cid}: {dest} is {new[dest]}, expected {want}"
        else:
            assert new[dest] == old[dest], f"{cid}: non-speculative {dest} changed {old[dest]} -> {new[dest]}"
    # the algorithm as written, and as the real parser read it
    assert repr(derived.algorithm) == old["speculative_algorithm"], cid
    if "algorithm" in case:
        assert derived.algorithm == case["algorithm"], cid
    assert sorted(t[0] for t in derived.carried) == sorted(case.get("carried", [])), cid
    env = _environment(case)
    assert [n for n in launch.speculative_env(list(env)) if launch.SIMULATED.match(n)] == case.get("simulated", []), cid
    if "env_dropped" in case:
        assert set(case["env_dropped"]) <= set(launch.speculative_env(list(env))), cid


@pytest.mark.sglang
@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_smoke_parses_exactly_the_entry_points_slice(version):
    """The deploy's parse_args smoke test gets the words sglang's entry point hands its parser:
    `sglang serve MODEL …` (0.5.23) and `python -u -m sglang.launch_server …` both parse; the
    words before the slice (`serve`, the interpreter's options) never reach the parser."""
    from types import SimpleNamespace

    from fleetspec.lab.envs import local_env
    from fleetspec.ops.preflight_result import Preflight
    from fleetspec.remote.smoke_host import RUNNER as _SMOKE_RUNNER

    table = launch.load_table(version)
    units = ["/v/bin/python3 -u -X faulthandler -m sglang.launch_server --model-path /m --speculative-algo EAGLE --port 1",
             "/v/bin/sglang serve --model-type llm --model-path /m --speculative-algorithm EAGLE --port 1"]
    if launch.serve_positional(version):
        units.append("/v/bin/sglang serve /m --port 1 --speculative-num-steps 3")
    scripts = []
    for i, words in enumerate(units):
        form = launch.classify(words.split())
        derived = launch.derive(form, table, FLAGS, version=version)
        pf = Preflight(host=None, root=Path("."), playbook=SimpleNamespace(smoke=SimpleNamespace(
            imports=(), parse_args=True, ddtree_sample=False, kernels=False), kernel_policy="optional"), service="s", python="p", unit=None,
            unit_bytes=b"", dropins={}, exec_argv=list(form.argv), sglang=SimpleNamespace(version=version),
            torch=None, hybrid=False, options=None, new_argv=derived.argv, patchset=None, kernels=[], form=form, launch=None)
        (name, script, _), = pf.smoke_scripts(kernels_dir="/k")
        words_parsed = pf.parse_slice()
        assert " ".join(FLAGS) in " ".join(words_parsed) and words_parsed[0].startswith("--")
        assert "serve" not in words_parsed and "-u" not in words_parsed and "--model-type" not in words_parsed
        scripts.append([f"{name}{i}", script])
    done = subprocess.run([str(local_env(version)), "-c", _SMOKE_RUNNER], input=json.dumps(scripts),
                          capture_output=True, text=True, timeout=600, cwd="/")
    ran = json.loads([x for x in done.stdout.splitlines() if x.startswith("FLEETSPEC-SMOKE ")][-1].split(" ", 1)[1])
    assert len(ran) == len(scripts)
    for name, (code, out) in ran.items():
        assert code == 0, f"{name}: {out[-500:]}"
        assert json.loads(out.strip().splitlines()[-1])["speculative_algorithm"] == "DFLASH"


@pytest.mark.sglang
def test_unknown_version_reads_the_hosts_own_parser(tmp_path, inventory_writer, sshd, ssh_client_key):
    """A version fleetspec has no table for: the host's python dumps its parser over SSH (real sshd)."""
    from fleetspec.errors import UserError
    from fleetspec.lab.envs import local_env
    from fleetspec.model.inventory import load_inventory
    from fleetspec.remote.option_table import option_table
    from fleetspec.remote.transport import Transport

    host = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key,
                                           command_timeout=330)).hosts["h"]
    t = Transport(host)
    try:
        got = option_table(t, str(local_env("0.5.23")), "9.9.9", "h")
        assert got.to_dict() == launch.load_table("0.5.23").to_dict()
        with pytest.raises(UserError, match="h: cannot read sglang 9.9.9's option parser"):
            option_table(t, "/nonexistent/python3", "9.9.9", "h")
    finally:
        t.close()

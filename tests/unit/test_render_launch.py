"""`fleetspec render` without a host: the derived launch of the lab's own unit, container unit,
Quadlet file and a published compose service, and of a bare argv, through preflight's derivation
(the packaged parser table of the version given), and preflight's one-line refusals. The CLI runs
in a child process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetspec.lab import profiles
from fleetspec.systemd_unit import exec_line

REPO = Path(__file__).resolve().parents[2]
DRAFT = "/root/models/Qwen3-8B-DFlash"
ARGS = ["--algo", "ddtree", "--sglang", "0.5.23", "--var", f"draft_model_path={DRAFT}"]
DDTREE = ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", DRAFT,
          "--speculative-ddtree-budget", "64", "--speculative-ddtree-topk-cap", "8"]
DFLASH = [["--speculative-algorithm", "DFLASH"], ["--speculative-draft-model-path", DRAFT],
          ["--speculative-num-draft-tokens", "16"]]


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(REPO), "render", *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def derived(*args: str) -> dict:
    r = render("--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def check_ct200(out: dict, head: list[str]) -> None:
    """ct200's argv, DFlash's group replaced by DDTree's flags in its place, the rest as it was."""
    argv = profiles.CT200_ARGV
    start = argv.index("--speculative-algorithm")
    assert out["argv"][:len(head)] == head
    engine = out["argv"][len(head):]
    assert engine[:start] == argv[:start] and engine[start:start + len(DDTREE)] == DDTREE, engine
    assert out["launch"]["dropped"] == DFLASH and out["env_set"] == {"SGLANG_DDTREE_LOG": "0"}
    assert "verify=auto -> tree (pure-attention target)" in out["notes"]


def test_argv(tmp_path):
    check_ct200(derived(*ARGS, "--", *profiles.CT200_ARGV), [])


def test_unit_file_unsets_speculation_only_environment(tmp_path):
    unit = tmp_path / "sglang.service"
    unit.write_text(f"[Service]\nEnvironment=SGLANG_ENABLE_SPEC_V2=1 HF_HOME=/x\nExecStart={exec_line(profiles.CT200_ARGV)}\n")
    out = derived(*ARGS, "--file", str(unit))
    check_ct200(out, [])
    assert out["env_unset"] == ["SGLANG_ENABLE_SPEC_V2"] and out["source"] == str(unit)


def test_container_unit_and_quadlet_derive_the_command_inside(tmp_path):
    unit = tmp_path / "sglang.service"
    unit.write_text(f"[Service]\nExecStart={exec_line(profiles.PODMAN_ARGV)}\n")
    check_ct200(derived(*ARGS, "--file", str(unit)), [])
    quadlet = tmp_path / "sglang-qwen.container"
    quadlet.write_text(profiles.quadlet_text(profiles.PROFILES["quadlet"]))
    check_ct200(derived(*ARGS, "--file", str(quadlet)), [])


def test_published_compose_service(tmp_path):
    case = next(c for c in yaml.safe_load((REPO / "tests/fixtures/container_corpus.yaml").read_text())
                if c["kind"] == "compose" and c["expect"] == "parsed")
    path = tmp_path / "compose.yaml"
    path.write_text(case["compose"])
    out = derived(*ARGS, "--file", str(path))
    argv = out["argv"]
    assert any(argv[i:i + len(DDTREE)] == DDTREE for i in range(len(argv))), argv
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"] and out["form"] == "python -m sglang.launch_server"
    assert out["source"].startswith(f"{path}: service ")


def test_text_output_names_each_part():
    r = render(*ARGS, "--", *profiles.CT200_ARGV)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "# argv (python -m sglang.launch_server), sglang 0.5.23, ddtree"
    assert lines[1].startswith("argv: /opt/sglang/venv/bin/python3 -m sglang.launch_server ") and "DDTREE" in lines[1]
    assert "env set: SGLANG_DDTREE_LOG=0" in lines
    assert any(ln.startswith("note: speculative options dropped: --speculative-algorithm DFLASH") for ln in lines)


@pytest.mark.parametrize("args,message", [
    (["--", "bash", "-c", "python3 -m sglang.launch_server --model-path /m"], "argv: the command is a shell wrapper"),
    (["--set", "verify=tree", "--hybrid", "--", *profiles.CT200_ARGV], "verify=tree is refused on a hybrid target"),
    (["--", "/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m", "--no-such-flag"],
     "--no-such-flag"),
    ([], "give one source"),
    # on a 141 GiB GPU sglang sizes its graphs for 32 x 16 verify tokens: DDTree's 65 do not fit
    (["--gpu-memory", "143771", "--", *profiles.CT200_ARGV],
     "holds 32 x 16 = 512 verify tokens; the new launch verifies 65 per request"),
])
def test_refusals_are_preflights_one_line(args, message):
    r = render(*ARGS, *args)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_a_unit_with_variables_is_refused_in_one_line(tmp_path):
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\nEnvironmentFile=/etc/sglang.env\nExecStart=/usr/bin/python3 -m sglang.launch_server "
                    "$ARGS\n")
    r = render(*ARGS, "--file", str(unit))
    assert r.returncode == 2 and "uses $VARIABLES" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr

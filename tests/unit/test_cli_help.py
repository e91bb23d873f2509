"""Help, completion and -v: every command has an example, every fault kind is in `lab fault
--help`, completion answers click's protocol from the real CLI in a child process, and -v shows
each remote command with its seconds and exit status, secrets hidden."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.lab.faults import KINDS
from fleetspec.remote.transport import redact

REPO = Path(__file__).resolve().parents[2]


def walk(group: click.Group, path=()):
    for name in group.list_commands(None):          # commands load on demand (cli/commands.py)
        cmd = group.get_command(None, name)
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from walk(cmd, (*path, name))


def test_every_command_has_an_example_line():
    runner = CliRunner()
    seen = []
    for path, _ in [((), main), *walk(main)]:
        r = runner.invoke(main, [*path, "--help"], terminal_width=100)
        assert r.exit_code == 0, (path, r.output)
        examples = [ln.strip() for ln in r.output.splitlines() if ln.strip().startswith("Example: fleetspec")]
        assert len(examples) == 1, (path, r.output)
        # The example names its own command (a group's example may name one of its commands).
        assert " ".join(path) in examples[0], (path, examples[0])
        seen.append(" ".join(path))
    assert {"status", "history", "deploy", "rollback", "inventory show", "lab fault"} <= set(seen)


def test_every_option_says_what_it_does():
    for path, cmd in [((), main), *walk(main)]:
        r = CliRunner().invoke(main, [*path, "--help"], terminal_width=200)
        for param in cmd.params:
            if isinstance(param, click.Option):
                assert param.help, (path, param.opts)
                assert param.opts[-1] in r.output, (path, param.opts)


def test_every_fault_kind_is_in_lab_fault_help():
    r = CliRunner().invoke(main, ["lab", "fault", "--help"], terminal_width=100)
    assert r.exit_code == 0
    listed = [ln.strip().split(":")[0].split("=")[0] for ln in r.output.splitlines() if ln.startswith("    ")]
    assert set(KINDS) <= set(listed), (sorted(KINDS), listed)
    assert "only_algorithm=NAME: a modifier" in r.output


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir()
    for algo in ("ddtree", "dflash", "nextn"):
        (root / "playbooks" / f"{algo}.yaml").write_text(f"algo: {algo}\n")
    (root / "inventory" / "lab.yaml").write_text(
        "defaults: {known_hosts: /dev/null, vars: {service: sglang-qwen.service}}\n"
        "groups: {gpu: [ct129, ct131], edge: [ct200]}\n"
        "hosts:\n  ct129: {address: ct129.gpu.example}\n  ct131: {address: ct131.gpu.example}\n"
        "  ct200: {address: ct200.gpu.example}\n")
    mirror = root / ".fleetspec" / "hosts" / "ct129@ct129.gpu.example_22" / "sglang-qwen.service"
    mirror.mkdir(parents=True)
    (mirror / "ledger.jsonl").write_text((REPO / "tests" / "fixtures" / "ledger" / "story.jsonl").read_text())
    return root


def complete(root: Path, words: list[str], shell: str = "bash") -> list[str]:
    """Ask the real CLI, as bash's completion function does (click's _FLEETSPEC_COMPLETE protocol)."""
    line = ["fleetspec", "--root", str(root), *words]
    env = {**os.environ, "_FLEETSPEC_COMPLETE": f"{shell}_complete", "COMP_WORDS": " ".join(line),
           "COMP_CWORD": str(len(line) - 1)}
    if shell != "bash":
        env["COMP_WORDS"] = " ".join(line)
    r = subprocess.run([sys.executable, "-c", "from fleetspec.cli import main; main(prog_name='fleetspec')"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not r.stderr, r.stderr
    return r.stdout.split("\n")


def test_completion_of_a_partial_host_name(root):
    out = complete(root, ["status", "ct1"])
    assert out[:2] == ["plain,ct129", "plain,ct131"] and "plain,ct200" not in out
    out = complete(root, ["history", "ct2"])
    assert out[0] == "plain,ct200"


def test_completion_of_groups_algos_and_releases(root):
    assert set(complete(root, ["deploy", "@"])) >= {"plain,@gpu", "plain,@edge", "plain,@all"}
    assert complete(root, ["deploy", "ct129", "--algo", "d"])[:2] == ["plain,ddtree", "plain,dflash"]
    ids = json.loads((REPO / "tests" / "fixtures" / "ledger" / "story-ids.json").read_text())
    out = complete(root, ["history", "ct129", "2025"])
    assert [w.split(",", 1)[1] for w in out if w] == sorted(ids.values(), reverse=True)
    assert [w for w in complete(root, ["rollback", "ct129", "--to", ids["healthy"][:20]]) if w] == \
        [f"plain,{ids['healthy']}"]
    # a host not in the inventory: every mirrored host's releases (model.layout.local_mirror, globbed)
    assert [w for w in complete(root, ["rollback", "zz", "--to", ids["healthy"][:20]]) if w] == \
        [f"plain,{ids['healthy']}"]


def test_completion_scripts_for_three_shells():
    for shell in ("bash", "zsh", "fish"):
        r = subprocess.run([sys.executable, "-c", "from fleetspec.cli import main; main(prog_name='fleetspec')"],
                           cwd=REPO, env={**os.environ, "_FLEETSPEC_COMPLETE": f"{shell}_source"},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "_FLEETSPEC_COMPLETE" in r.stdout, (shell, r.stderr)


def test_completion_without_an_inventory_completes_nothing(tmp_path):
    (tmp_path / "inventory").mkdir()
    assert not any(complete(tmp_path, ["status", "ct"]))


def test_verbose_prints_each_remote_command(sshd, tmp_path, ssh_client_key, inventory_writer):
    root = tmp_path / "root"
    for sub in ("inventory", "playbooks", "templates"):
        (root / sub).mkdir(parents=True)
    inventory_writer(root / "inventory" / "lab.yaml", {"a": sshd}, ssh_client_key,
                     host_vars={"a": "{api_key: {secret_env: OPX_VERBOSE_KEY}}"})
    env = {**os.environ, "OPX_VERBOSE_KEY": "sk-opx-1234567"}
    r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), "-v", "status", "a", "--json"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr                              # no engine on its port: down
    trace = [ln for ln in r.stderr.splitlines() if ln.startswith("[a] ")]
    assert trace, r.stderr
    assert trace[0].split()[2] == "connected:", trace[0]            # the route first: where the inventory and ssh_config led
    first = next(ln for ln in trace if ln.split()[2] != "connected:").split()
    assert first[1].endswith("s") and float(first[1][:-1]) >= 0 and first[2] == "rc=0:", trace
    assert any("GET http://127.0.0.1:30000/health" in ln and ("error:" in ln or "HTTP" in ln) for ln in trace), trace
    assert "systemctl show" in r.stderr                       # the fact batch, whole
    assert "sk-opx-1234567" not in r.stderr
    assert json.loads(r.stdout)["host"] == "a"                # stdout stays the JSON
    quiet = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), "status", "a", "--json"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert not [ln for ln in quiet.stderr.splitlines() if ln.startswith("[a] ")]


def test_redaction_of_secret_looking_words():
    assert redact("sglang --api-key sk-1 --port 30000") == "sglang --api-key <redacted> --port 30000"
    assert redact("curl -H 'Authorization: Bearer abc'") == "curl -H 'Authorization: <redacted>'"
    assert redact("env SGLANG_API_KEY=abc HF_TOKEN='x y' run") == "env SGLANG_API_KEY=<redacted> HF_TOKEN=<redacted> run"
    assert redact('{"api_key": "zz", "model": "m"}') == '{"api_key": <redacted>, "model": "m"}'
    assert redact("--model-path /root/models/Qwen3.6-27B") == "--model-path /root/models/Qwen3.6-27B"


def test_verbose_hides_the_values_of_playbook_secret_env(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from fleetspec.cli.output import verbose_observer

    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "x.yaml").write_text("algo: x\nlaunch: {secret_env: [OPX_HF_AUTH]}\n")
    monkeypatch.setenv("OPX_HF_AUTH", "hf-opx-77-secret")
    observe = verbose_observer(SimpleNamespace(root_path=tmp_path))
    observe("a", "printf %s hf-opx-77-secret > /etc/x\nsecond line", 0.25, "rc=0")
    err = capsys.readouterr().err
    assert err == "[a] 0.250s rc=0: printf %s <redacted> > /etc/x\n    second line\n"


def test_every_command_module_is_named_in_the_lazy_map_and_a_deploy_loads_only_its_own():
    import importlib

    from fleetspec.cli import commands

    for module in set(commands.MODULES.values()):
        names = [c.name for c in importlib.import_module(f"fleetspec.cli.{module}").COMMANDS]
        assert names and all(commands.MODULES[n] == module for n in names), (module, names)
    code = ("import sys; from fleetspec.cli import main; sys.argv = ['fleetspec', 'deploy', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('fleetspec.cli.') or m in ('invoke', 'tenacity')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    loaded = out.strip().splitlines()[-1]
    assert "fleetspec.cli.deploy_cmd" in loaded
    for other in ("patchset_cmd", "kernels_cmd", "bench_cmd", "lab_cmd", "history_cmd"):
        assert f"fleetspec.cli.{other}" not in loaded, loaded
    code = "import sys, fleetspec.remote.transport as t; print('invoke' in sys.modules, t.paramiko.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.split() == ["False", "paramiko"]          # paramiko without invoke (remote/ssh_lib.py)

"""Security, second audit: what a hostile host, a local user or a careless inventory could still do.

Each test drives fleetspec's own functions against real things (the loopback sshd and its shell,
real files, the real option tables and parsers); each failed on the code before its fix.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetspec.model import launch
from fleetspec.model.baseline import Baseline
from fleetspec.model.playbook import load_playbook
from fleetspec.ops.hoststate import HostState
from fleetspec.remote.facts import unitfile

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "sglang-test.service"


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# Secrets in ExecStart: redacted by option name -------------------------------------------------
SECRET_UNIT = ("[Service]\nExecStart=/opt/venv/bin/python3 -m sglang.launch_server --model-path /m "
               "--admin-api-key adm1n-S3CRET --ssl-keyfile /etc/k.pem --ssl-keyfile-password=pw-S3CRET "
               "--api-key sk-S3CRET --port 30000 --speculative-algorithm EAGLE\n")
SECRETS = ("adm1n-S3CRET", "pw-S3CRET", "sk-S3CRET")


def _secret_preflight(t):
    from fleetspec.ops import argv as argv_ops
    from fleetspec.ops.preflight import Preflight

    cmd = unitfile.effective_exec_command(SECRET_UNIT)
    form = launch.classify(list(cmd.argv), path=cmd.path, prefix=cmd.flags)
    derived = launch.derive(form, launch.load_table("0.5.23"), ["--speculative-algorithm", "DDTREE"])
    playbook = load_playbook(ROOT / "playbooks" / "ddtree.yaml")
    return Preflight(host=t.host, root=ROOT, playbook=playbook, service=SERVICE, python=sys.executable,
                     unit=None, unit_bytes=SECRET_UNIT.encode(), dropins={}, exec_argv=list(form.argv),
                     sglang=SimpleNamespace(version="0.5.23"), torch=None, hybrid=False,
                     options=argv_ops.ResolvedOptions(values={"budget": 64}), new_argv=derived.argv,
                     patchset=None, kernels=[], form=form)


def test_secret_options_in_execstart_are_redacted_in_plan_ledger_mirror_and_history(t, tmp_path):
    """--admin-api-key, --ssl-keyfile-password and --api-key (the inventory names no api_key)
    used to reach --plan, the preflight ledger line, the mirror and `history --json` verbatim;
    the baseline keeps the unit's bytes exact, 0600."""
    from fleetspec.model import ledger as L
    from fleetspec.ops import history, planning

    assert t.host.vars.api_key is None
    pf = _secret_preflight(t)
    assert all(s in " ".join(pf.new_argv) for s in SECRETS)          # the derived command keeps them
    mirror = tmp_path / "mirror"
    state = HostState(t, "h", SERVICE, root=tmp_path / "state", mirror=mirror, redact=pf.redact)
    shown = json.dumps(planning.plan(t, pf, state).to_dict())
    state.record(L.Entry.step("r1", "preflight", L.StepState.OK, **pf.summary()))
    for text in (shown, (tmp_path / "state" / "sglang-test" / "ledger.jsonl").read_text(),
                 (mirror / "ledger.jsonl").read_text()):
        assert "<redacted>" in text and not any(s in text for s in SECRETS), text
    assert "--ssl-keyfile" in shown and "/etc/k.pem" in shown      # a path is not a secret
    # a line an older version wrote unredacted is hidden when history reads it back
    old = L.Entry.step("r0", "preflight", L.StepState.OK, argv=list(pf.exec_argv)).to_line()
    with open(tmp_path / "state" / "sglang-test" / "ledger.jsonl", "a") as f:
        f.write(old + "\n")
    state_root = HostState(t, "h", SERVICE, root=tmp_path / "state")
    read = history._redacted(state_root.ledger_with_archive())
    assert not any(s in e.to_line() for e in read.entries for s in SECRETS)
    # the baseline: exact unit bytes, 0600
    baseline = Baseline(service=SERVICE, unit_path="/etc/systemd/system/" + SERVICE, unit_bytes=SECRET_UNIT.encode(),
                        dropins={}, exec_argv=list(pf.exec_argv), environment={}, sglang={},
                        served_algorithm="EAGLE", declared_algorithm="EAGLE", modes={"/etc/systemd/system/" + SERVICE: 0o644})
    state.write_baseline(baseline)
    folder = tmp_path / "state" / "sglang-test" / "baseline"
    assert (folder / "unit").read_bytes() == SECRET_UNIT.encode() and mode(folder / "baseline.json") == 0o600
    assert Baseline.from_json((folder / "baseline.json").read_text()).unit_bytes == SECRET_UNIT.encode()
    assert mode(mirror / "baseline.json") == 0o600


def test_the_secret_options_are_the_ones_both_parsers_know():
    from fleetspec.ops.redaction import SECRET_OPTIONS, argv_secrets, is_secret_option

    for version in ("0.5.13.post1", "0.5.23"):
        table = launch.load_table(version)
        assert all(o in table.options for o in SECRET_OPTIONS), version
    assert argv_secrets(["--adm", "a1", "--ssl-keyfile", "/k", "--ssl-keyfile-pass=p2", "--api-key=k3"]) == [
        "a1", "p2", "k3"]
    assert not is_secret_option("--ssl-keyfile") and not is_secret_option("--port")


# Terminal escapes from a host: made visible at the output boundary -------------------------------
OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"            # set the clipboard to `rm -rf ~`
HOSTILE = f"EAGLE{OSC52}\x9b2J\u202ex\x1b[8mhidden\r"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def _clean(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07" in text and "\\x9b" in text and "\\u202e" in text, repr(text)


def test_history_prints_a_probe_reason_with_escape_sequences_made_visible(tmp_path):
    """A probe reason the host sent (kept in the ledger) printed through the real CLI: Click
    stripped only CSI off a terminal, so OSC 52 and C1 controls reached the screen."""
    from click.testing import CliRunner

    from fleetspec.cli import main
    from fleetspec.model import ledger as L
    from fleetspec.model.layout import local_mirror

    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    (tmp_path / "inventory" / "key").write_text("k")
    (tmp_path / "inventory" / "lab.yaml").write_text(
        "defaults: {ssh_key: key, known_hosts: kh, connect_timeout: 1}\n"
        "hosts:\n  a: {address: 127.0.0.1, port: 1, vars: {service: sglang-test.service}}\n")
    mirror = local_mirror(tmp_path, "a", "sglang-test.service")
    mirror.mkdir(parents=True)
    lines = [L.Entry.step("r1", "probes", L.StepState.FAILED, reason=f"/server_info says {HOSTILE}").to_line(),
             L.Entry.status("r1", L.ROLLED_BACK, reason=f"probes: {HOSTILE}").to_line()]
    (mirror / "ledger.jsonl").write_text("".join(line + "\n" for line in lines))
    for args in (["history", "a"], ["history", "a", "r1"]):
        r = CliRunner().invoke(main, ["--root", str(tmp_path), *args])
        assert r.exit_code == 0, r.output
        _clean(r.output)


def test_status_and_the_deploy_summary_print_host_text_made_visible(capsys):
    """The served algorithm (status), a probe reason and journal lines (the deploy summary)."""
    from fleetspec.cli import deploy_cmd, status_cmd
    from fleetspec.ops.outcome import DeployOutcome, Outcome
    from fleetspec.ops.status import HostStatus

    status_cmd._emit([HostStatus(host="a", address="127.0.0.1:22", service=SERVICE, reachable=True, health="ok",
                                 algo=HOSTILE, served_algo=HOSTILE, state="active/running")], False)
    deploy_cmd._print_deploy_summary([DeployOutcome(host="a", status=Outcome.ROLLED_BACK, reason=f"probes: {HOSTILE}",
                                                    evidence={"journal": [f"engine: {HOSTILE}"]})])
    got = capsys.readouterr()
    _clean(got.out)
    _clean(got.err)


def test_nothing_in_the_cli_prints_around_the_output_boundary():
    """Every line goes through cli/output.py (echo, Out, Progress): no other printer in cli/."""
    import re

    cli = ROOT / "fleetspec" / "cli"
    for path in cli.glob("*.py"):
        if path.name in ("output.py", "terminal.py"):
            continue
        text = path.read_text()
        assert not re.search(r"click\.(echo|secho)\(|(?<![\w.])print\(|sys\.std(out|err)\.write", text), path

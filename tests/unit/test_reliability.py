"""Pure and loopback parts of the reliability suite (the lab parts: tests/lab/test_reliability_*.py).

Each test here pins a bug the lab suite found: a command's output cut short when sshd sent the
exit status before the last bytes; in-place undo of a partly applied release; a stale lock told
apart from a live one; status telling "host unchanged" from "finish with rollback"; a torn ledger
line never swallowing the line after it; secrets kept out of drop-ins, plans and ledgers.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess

import pytest

from fleetspec.model import ledger as L
from fleetspec.model.release import Release
from fleetspec.remote import files
from fleetspec.remote.facts import release_state
from fleetspec.remote.lock_holder import Holder
from fleetspec.remote.release_files import in_place_apply_script, in_place_undo_script


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# Transport: the whole output, every time -------------------------------------------------------
def test_large_outputs_are_never_cut_short(sshd, ssh_client_key, inventory_writer, tmp_path):
    from fleetspec.model.inventory import load_inventory
    from fleetspec.remote.transport import Transport

    inv = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key))
    blob = tmp_path / "blob"
    blob.write_bytes(os.urandom(150_000).hex().encode())      # 300 kB, like a long ledger
    t = Transport(inv.hosts["h"])
    try:
        sizes = {len(t.run_script(f"cat {blob}", timeout=30, check=True).stdout) for _ in range(120)}
    finally:
        t.close()
    assert sizes == {300_000}


# In-place undo of a partly applied release --------------------------------------------------------
def _setup(tmp_path):
    site, rdir = tmp_path / "site", tmp_path / "release"
    (site / "sglang/srt").mkdir(parents=True)
    base = {"sglang/srt/a.py": b"A = 1\n", "sglang/srt/b.py": b"B = 1\n"}
    new = {"sglang/srt/a.py": b"A = 2\n", "sglang/srt/b.py": b"B = 2\n", "sglang/srt/c.py": b"C = 2\n"}
    for p, data in base.items():
        (site / p).write_bytes(data)
    for p, data in new.items():
        (rdir / "patch" / p).parent.mkdir(parents=True, exist_ok=True)
        (rdir / "patch" / p).write_bytes(data)
    release = Release(id="r", host="h", service="s.service", algo="ddtree", mode="in-place", sglang_version="x",
                      argv=[], previous="baseline", site_packages=str(site),
                      files={p: sha(b) for p, b in new.items()},
                      base_files={"sglang/srt/a.py": sha(base["sglang/srt/a.py"]),
                                  "sglang/srt/b.py": sha(base["sglang/srt/b.py"]), "sglang/srt/c.py": None})
    return site, rdir, release, base


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _sh(script):
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True)


def test_undo_of_a_release_killed_before_any_backup_changes_nothing(tmp_path):
    site, rdir, release, base = _setup(tmp_path)
    before = _tree(site)
    r = _sh(in_place_undo_script(release, str(rdir)))          # nothing was backed up, nothing replaced
    assert r.returncode == 0, r.stderr
    assert _tree(site) == before


def test_undo_of_a_release_killed_halfway_through_replacing(tmp_path):
    site, rdir, release, base = _setup(tmp_path)
    before = _tree(site)
    assert _sh(in_place_apply_script(release, str(rdir))).returncode == 0
    (site / "sglang/srt/b.py").write_bytes(base["sglang/srt/b.py"])      # b.py not replaced yet
    r = _sh(in_place_undo_script(release, str(rdir)))
    assert r.returncode == 0, r.stderr
    assert _tree(site) == before


def test_undo_never_overwrites_a_file_it_has_no_verified_backup_for(tmp_path):
    site, rdir, release, base = _setup(tmp_path)
    (site / "sglang/srt/a.py").write_bytes(b"EDITED BY HAND\n")
    r = _sh(in_place_undo_script(release, str(rdir)))
    assert r.returncode != 0
    assert (site / "sglang/srt/a.py").read_bytes() == b"EDITED BY HAND\n"


# The lock's holder: stale or alive ----------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("ours,pid,remote,dead,boot", [
    (True, None, 123, True, None),            # this controller's, and its process is gone: stale
    (True, os.getpid(), 123, False, None),    # alive here: never stolen
    (False, None, 123, False, None),          # another controller (same hostname or not): nobody here can tell
    (True, None, None, False, None),          # no remote pid recorded: never guessed
    (True, None, 123, False, "another-boot"),  # its id, copied to another machine (or before a reboot)
    (True, None, 123, False, ""),             # recorded without a machine and boot: never guessed
])
def test_a_holder_is_stale_only_when_its_process_is_gone_from_this_controller(ours, pid, remote, dead, boot):
    from fleetspec.identity import controller_id, machine_boot

    h = Holder(who="u", machine=socket.gethostname(), pid=pid or _dead_pid(), since=0, release="r",
               remote_pid=remote, controller=controller_id() if ours else "another-controller-id",
               boot=machine_boot() if boot is None else boot)
    assert h.dead_here() is dead


# Status wording ---------------------------------------------------------------------------------
def _state(*entries, locked=False):
    return release_state.ReleaseState(managed=True, current=None, baseline=True, last_entry=entries[-1],
                                      last_status=[e for e in entries if e["kind"] == "status"][-1], locked=locked)


def test_status_tells_a_host_left_unchanged_from_one_to_roll_back():
    staged = _state({"kind": "status", "release": "r1", "name": "release", "state": "staged"},
                    {"kind": "step", "release": "r1", "name": "smoke", "state": "started"})
    assert "before switching (host unchanged)" in staged.interrupted and "rollback" not in staged.interrupted
    switched = _state({"kind": "step", "release": "r1", "name": "switch", "state": "started"},
                      {"kind": "status", "release": "r1", "name": "release", "state": "switched"})
    assert "interrupted" in switched.interrupted and switched.needs_rollback and not staged.needs_rollback
    assert "after step release" not in switched.interrupted
    assert switched.__class__(**{**switched.__dict__, "locked": True}).interrupted is None


# The ledger: a torn line never swallows the next one ------------------------------------------------
def test_a_line_appended_after_a_torn_one_stays_whole(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(L.Entry.step("r0", "stage", "started").to_line() + "\n" + '{"by":"x","kind":"st')
    entry = L.Entry.step("r1", "rollback", "ok")
    assert _sh(files.append_line(str(ledger), entry.to_line())).returncode == 0
    parsed = L.parse(ledger.read_text())
    assert parsed.skipped == (2,)
    assert parsed.entries[-1] == entry
    assert _sh(files.append_line(str(tmp_path / "new.jsonl"), entry.to_line())).returncode == 0
    assert (tmp_path / "new.jsonl").read_text() == entry.to_line() + "\n"


# systemctl show with an argv word that holds a newline ------------------------------------------
def test_systemctl_show_with_a_newline_in_an_argv_word_parses():
    from fleetspec.remote.facts import systemd

    out = ("Result=success\nNRestarts=0\nExecStart={ path=/opt/venv/bin/python3 ; argv[]=/opt/venv/bin/python3 "
           "-m sglang.launch_server --served-model-name a b %s $HOME ;\nsecond line=x\\x41 --port 30000 ; "
           "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
           "MainPID=42\nActiveState=active\nSubState=running\nLoadState=loaded\nUnitFileState=enabled\n"
           "FragmentPath=/etc/systemd/system/x.service\nDropInPaths=\nEnvironment=\n")
    unit = systemd.parse(out, "x.service")
    assert (unit.active_state, unit.sub_state, unit.main_pid, unit.unit_file_state) == ("active", "running", 42, "enabled")
    assert unit.argv[-2:] == ["--port", "30000"] and "$HOME ;\nsecond" in " ".join(unit.argv)


# Secrets: an EnvironmentFile only root reads; values redacted everywhere --------------------------
def test_env_file_escapes_what_systemd_unescapes():
    from fleetspec.ops.staging import env_file_text

    text = env_file_text({"TOKEN": 'a "b" $HOME `x` \\ end', "PLAIN": "v"})
    assert text == 'TOKEN="a \\"b\\" \\$HOME \\`x\\` \\\\ end"\nPLAIN="v"\n'


def test_redact_covers_api_key_and_secret_env_in_plain_and_json_forms(monkeypatch):
    from types import SimpleNamespace

    from fleetspec.model.inventory import SecretRef
    from fleetspec.ops.redaction import redact

    monkeypatch.setenv("T_API", "sk-123")
    monkeypatch.setenv("T_TOK", 'tok "q"')
    host = SimpleNamespace(vars=SimpleNamespace(api_key=SecretRef("T_API")))
    playbook = SimpleNamespace(launch=SimpleNamespace(secret_env=("T_TOK",)))
    line = json.dumps({"argv": ["--api-key", "sk-123"], "env": 'tok "q"'})
    assert "sk-123" not in redact(line, host, playbook) and "tok" not in redact(line, host, playbook)
    assert redact('x tok "q" y', host, playbook) == "x <redacted> y"


# Bad input refused before any host is contacted ----------------------------------------------------
@pytest.mark.parametrize("service", ["../../../tmp/evil.service", "x;touch /tmp/pwned.service", "sglang",
                                     ".hidden.service", "a..b.service"])
def test_inventory_refuses_a_service_that_is_not_a_unit_name(tmp_path, service):
    from click.testing import CliRunner

    from fleetspec.cli import main

    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    (tmp_path / "inventory" / "key").write_text("k")
    (tmp_path / "inventory" / "lab.yaml").write_text(
        "defaults: {ssh_key: key, known_hosts: kh}\nhosts:\n  a: {address: 127.0.0.1, vars: {service: '"
        + service.replace("'", "''") + "'}}\n")
    r = CliRunner().invoke(main, ["--root", str(tmp_path), "status", "a"])
    assert r.exit_code == 2 and "vars.service: expected a systemd unit name" in r.output, r.output


def _patchset(tmp_path, content=b"X = 1\n", listed=b"X = 1\n"):
    from fleetspec.build.patchset import load_patchset

    root = tmp_path / "ps"
    (root / "files/sglang").mkdir(parents=True)
    (root / "files/sglang/x.py").write_bytes(content)
    (root / "manifest.json").write_text(json.dumps({"package": "sglang", "version": "1", "files": [
        {"path": "sglang/x.py", "action": "add", "sha256": sha(listed)}]}))
    return load_patchset(root)


def test_a_patch_set_file_changed_since_its_build_is_refused(tmp_path):
    from fleetspec.errors import ConfigError
    from fleetspec.ops.preflight_checks import check_contents

    check_contents(_patchset(tmp_path))
    with pytest.raises(ConfigError, match="changed since the patch set was built"):
        check_contents(_patchset(tmp_path / "b", content=b"X = 1\nimport os\n"))


def test_a_huge_patch_set_file_is_refused_without_reading_it(tmp_path):
    from fleetspec.errors import ConfigError
    from fleetspec.ops.preflight_checks import check_contents

    ps = _patchset(tmp_path)
    with open(ps.source(ps.files[0]), "r+b") as fh:
        fh.truncate(8 << 30)                       # 8 GiB, sparse
    with pytest.raises(ConfigError, match="at most 64 MiB"):
        check_contents(ps)


def test_baseline_lines_are_not_a_release():
    lines = [L.Entry.step("baseline", "retake", "ok"), L.Entry.step("r1", "stage", "started"),
             L.Entry.status("r1", L.FAILED)]
    parsed = L.parse(L.render(lines))
    assert parsed.releases() == {"r1": L.FAILED} and parsed.interrupted() == []


def test_status_names_the_rollback_to_run_for_a_switched_deploy():
    """The fact says what happened; ops/status adds the command, with the host's name."""
    from types import SimpleNamespace

    from fleetspec.ops.status import HostStatus, _fill_state

    switched = _state({"kind": "step", "release": "r1", "name": "switch", "state": "started"},
                      {"kind": "status", "release": "r1", "name": "release", "state": "switched"})
    row = HostStatus("ct9", "ct9.example", "s.service")
    _fill_state(row, switched, SimpleNamespace(name="ct9"))
    assert row.notes == [f"{switched.interrupted}; finish it with: fleetspec rollback ct9"]
    staged = _state({"kind": "status", "release": "r1", "name": "release", "state": "staged"},
                    {"kind": "step", "release": "r1", "name": "smoke", "state": "started"})
    row = HostStatus("ct9", "ct9.example", "s.service")
    _fill_state(row, staged, SimpleNamespace(name="ct9"))
    assert row.notes == [staged.interrupted] and row.drift == "pristine"

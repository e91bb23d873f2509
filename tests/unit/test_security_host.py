"""Security on a real host (the loopback sshd, as root; issue 13 items 1, 2, 3 and 5).

1. Remote python (the smoke runner, py_compile, facts) never imports from the folder it starts in
   nor from /tmp: a module planted there by a local user is not run as root.
2. The unit-lint scratch folder cannot be made first: a planted folder with a `<svc>.d` symlink at
   the old predictable path gets no write.
3. Baseline copies keep their source's mode or tighter, and a rollback restores each file with the
   mode it had; state folders are 0700; the controller's mirror is 0600 in a 0700 folder.
5. Every durable write fsyncs the file before its rename and the folder after it (seen with strace
   on the real sshd and shell, and on the controller's own writes).

State roots point at this test's scratch folder (HostState(root=...)), so nothing is written under
the machine's /var/lib/fleetspec. The only files put in /tmp have names no other program imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fleetspec.errors import FleetspecError
from fleetspec.model import ledger as L
from fleetspec.model.baseline import Baseline
from fleetspec.model.inventory import load_inventory
from fleetspec.model.layout import HostLayout
from fleetspec.model.release import Release
from fleetspec.ops import activation, rendering, smoke_run
from fleetspec.ops.hoststate import HostState, append_private, write_private
from fleetspec.remote import files, stage_host
from fleetspec.remote.facts import sglang as sglang_fact
from fleetspec.remote.facts import torch as torch_fact
from fleetspec.remote.smoke_host import _EMIT
from fleetspec.remote.transport import Transport
from tests import conftest

SERVICE = "sglang-test.service"


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _as_nobody(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", script], capture_output=True, text=True)


# 1. Remote python starts nowhere anyone else can write ------------------------------------------
@pytest.fixture
def planted(tmp_path):
    """A module under a name nothing else imports, planted by `nobody` in /tmp (the old start
    folder) and, as the worst case, in the runner's own start folder next to a json.py (the
    runner's first import) that would leave a marker if it ran."""
    if shutil.which("runuser") is None:
        pytest.skip("runuser is not installed")
    name = f"fleetspec_planted_{secrets.token_hex(6)}"
    marker = tmp_path / "PWNED"
    in_tmp = Path("/tmp") / f"{name}.py"
    body = f"open({str(marker)!r}, 'a').write(__file__ + '\\n')\n"
    r = _as_nobody(f"umask 022; printf %s {shlex.quote(body)} > {in_tmp}")
    assert r.returncode == 0 and in_tmp.stat().st_uid != 0, r.stderr     # a non-root user could plant it
    rundir = tmp_path / "state" / "run"
    rundir.mkdir(parents=True)
    rundir.chmod(0o777)                      # as if the folder had been left open: the code must tighten it
    (rundir / f"{name}.py").write_text(body)
    (rundir / "json.py").write_text(body + "raise SystemExit(42)\n")
    (rundir / "py_compile.py").write_text(body + "raise SystemExit(43)\n")
    try:
        yield SimpleNamespace(name=name, marker=marker, rundir=rundir, root=tmp_path / "state")
    finally:
        in_tmp.unlink(missing_ok=True)


def test_the_smoke_runner_imports_nothing_from_its_start_folder_or_tmp(t, planted):
    probe = _EMIT + textwrap.dedent(f"""
        import importlib.util, json, os
        _emit(importlib.util.find_spec({planted.name!r}) is None, cwd=os.getcwd(), json=json.__file__,
              error="a planted module is importable")
    """)
    pf = SimpleNamespace(python=sys.executable, smoke_scripts=lambda kernels_dir: [
        ("probe", probe, lambda out, err, code: {**json.loads(out.strip().splitlines()[-1]), "code": code})])
    state = HostState(t, "h", SERVICE, root=planted.root)
    release = Release(id="r1", host="h", service=SERVICE, algo="ddtree", mode="release", sglang_version="x",
                      argv=["/bin/true"], previous="baseline")
    out = smoke_run.smoke(t, pf, state, release)["smoke"]["probe"]
    assert not planted.marker.exists(), planted.marker.read_text()
    assert out["cwd"] == str(planted.rundir) and not out["json"].startswith(str(planted.rundir))
    assert mode(planted.rundir) == 0o700


def test_the_stage_program_and_its_py_compile_import_nothing_from_their_start_folder(t, planted, tmp_path):
    """The stage command's python (remote/stage_host.py) imports json first and py_compile for the
    patched modules: neither planted copy runs, and a module that does not compile still fails."""
    good = b"x = 1\n"
    digest = hashlib.sha256(good).hexdigest()
    plan = stage_host.Plan(store=str(planted.root / "objects"), final=str(planted.root / "r1"),
                           blobs={digest: good}, patch={"pkg/ok.py": digest}, compile=["patch/pkg/ok.py"],
                           manifest="{}")
    stage_host.stage(t, sys.executable, str(planted.rundir), plan, timeout=60)
    assert not planted.marker.exists() and (planted.root / "r1" / "patch" / "pkg" / "__pycache__").is_dir()
    assert mode(planted.rundir) == 0o700
    bad = b"def (\n"
    plan = stage_host.Plan(store=str(planted.root / "objects"), final=str(planted.root / "r2"),
                           blobs={hashlib.sha256(bad).hexdigest(): bad}, patch={"pkg/bad.py": hashlib.sha256(bad).hexdigest()},
                           compile=["patch/pkg/bad.py"], manifest="{}")
    with pytest.raises(FleetspecError, match="py_compile failed"):
        stage_host.stage(t, sys.executable, str(planted.rundir), plan, timeout=60)
    assert not planted.marker.exists()


def test_python_c_keeps_pythonpath_and_falls_back_to_root_when_the_folder_cannot_be_made(t, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = "import os, sys; print(os.getcwd()); print(os.environ['PYTHONPATH'] in sys.path); print(sys.flags.safe_path)"
    r = t.run_script(files.python_c(sys.executable, code, env={"PYTHONPATH": str(tmp_path)},
                                    rundir=str(blocker / "run")), timeout=30, check=True)
    assert r.stdout.split() == ["/", "True", "True"]


def test_facts_that_run_python_go_through_the_guarded_start():
    for fact in (torch_fact, sglang_fact):
        assert fact.command("/x/python3") == files.python_c("/x/python3", fact.SNIPPET, keep=False)
        assert fact.command("/x/python3", keep=True) == files.python_c("/x/python3", fact.SNIPPET,
                                                                        env=files.KEEP_CACHE, keep=True)
    assert "PYTHONSAFEPATH=1" in files.python_c("p", "c") and "cd /tmp" not in files.python_c("p", "c")


def test_a_python_start_that_keeps_nothing_writes_nothing_on_the_host(t, tmp_path):
    """status and --plan (keep False) start the host's python from `/`: no run folder made, no trust
    verdict kept, no bytecode written; a deploy's start (keep True) keeps the verdict."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python3")                 # its own venv: a verdict name of its own
    pkg = tmp_path / "mods"
    (pkg / "probe_mod").mkdir(parents=True)
    (pkg / "probe_mod" / "__init__.py").write_text("X = 1\n")
    rundir = tmp_path / "state" / "run"
    kept = set(os.listdir(files.RUN_DIR)) if os.path.isdir(files.RUN_DIR) else set()
    code = "import os, probe_mod; print(os.getcwd())"
    r = t.run_script(files.python_c(python, code, env={"PYTHONPATH": str(pkg)}, rundir=str(rundir), keep=False),
                     timeout=60, check=True)
    assert r.stdout.split() == ["/"] and not rundir.exists()
    assert not (pkg / "probe_mod" / "__pycache__").exists()
    assert (set(os.listdir(files.RUN_DIR)) if os.path.isdir(files.RUN_DIR) else set()) == kept
    t.run_script(files.python_c(python, code, env={"PYTHONPATH": str(pkg)}, rundir=str(rundir)), timeout=60, check=True)
    assert rundir.is_dir() and len(set(os.listdir(files.RUN_DIR)) - kept) == 1       # the verdict, kept


# 2. Lint scratch ----------------------------------------------------------------------------------
def test_a_planted_lint_folder_cannot_redirect_the_drop_in(t, tmp_path, monkeypatch):
    """The old scratch name was /tmp/fleetspec-lint-<svc>-<ms>: plant it (with the clock fixed so
    its name is known), its `<svc>.d` a symlink to a folder of ours; nothing may be written there."""
    service = f"fs-lint-{secrets.token_hex(4)}.service"
    now = 1_800_000_000.123

    monkeypatch.setattr(rendering, "time", SimpleNamespace(time=lambda: now, strftime=time.strftime,
                                                            gmtime=time.gmtime))
    target = tmp_path / "target"
    target.mkdir()
    planted = Path(f"/tmp/fleetspec-lint-{service}-{int(now * 1000)}")
    try:
        planted.mkdir()
        (planted / f"{service}.d").symlink_to(target)
        root = tmp_path / "state"
        pf = SimpleNamespace(service=service, unit_bytes=b"[Service]\nExecStart=/bin/true\n",
                             layout=HostLayout(service, root))
        assert rendering.lint_unit(t, pf, "[Service]\nEnvironment=A=1\n") == "ok"
        assert list(target.iterdir()) == [] and list(planted.iterdir()) == [planted / f"{service}.d"]
        assert mode(root / "run") == 0o700 and list((root / "run").iterdir()) == []   # scratch removed
    finally:
        shutil.rmtree(planted, ignore_errors=True)


def test_each_lint_gets_a_fresh_private_folder(t, tmp_path):
    run = str(tmp_path / "state" / "run")
    a = t.run_script(files.scratch_dir(run), timeout=30, check=True).stdout.strip()
    b = t.run_script(files.scratch_dir(run), timeout=30, check=True).stdout.strip()
    assert a != b and Path(a).parent == Path(b).parent == Path(run)
    assert mode(a) == mode(run) == 0o700 and os.stat(a).st_uid == 0


# 3. Modes of copies, state folders, mirror --------------------------------------------------------
@pytest.fixture
def live(tmp_path):
    """A unit (0644) and an admin drop-in holding a token (0600), as an operator left them."""
    etc = tmp_path / "etc"
    (etc / f"{SERVICE}.d").mkdir(parents=True)
    unit, dropin = etc / SERVICE, etc / f"{SERVICE}.d" / "10-token.conf"
    unit.write_bytes(b"[Service]\nExecStart=/bin/true\n")
    dropin.write_bytes(b"[Service]\nEnvironment=HF_TOKEN=hf_secret\n")
    unit.chmod(0o644)
    dropin.chmod(0o600)
    return SimpleNamespace(unit=unit, dropin=dropin)


def _baseline(live) -> Baseline:
    return Baseline(service=SERVICE, unit_path=str(live.unit), unit_bytes=live.unit.read_bytes(),
                    dropins={str(live.dropin): live.dropin.read_bytes()}, exec_argv=["/bin/true"], environment=[],
                    sglang={}, served_algorithm=None, declared_algorithm=None)


def test_baseline_copies_keep_their_modes_and_state_folders_stay_private(t, tmp_path, live):
    root = tmp_path / "state"
    base = root / "sglang-test"
    base.mkdir(parents=True)
    base.chmod(0o755)                         # as earlier versions left it
    mirror = tmp_path / "fleet" / ".fleetspec" / "hosts" / "h" / SERVICE
    state = HostState(t, "h", SERVICE, mirror=mirror, root=root)
    state.record(L.Entry.step("r1", "preflight", "ok"))
    assert mode(base) == 0o700 and mode(base / "ledger.jsonl") == 0o600
    state.write_baseline(_baseline(live))
    copies = base / "baseline"
    assert mode(copies) == mode(copies / "dropins") == 0o700
    assert mode(copies / "baseline.json") == 0o600                 # it holds every drop-in's bytes
    assert mode(copies / "unit") == 0o600                          # 0644 source: owner bits only
    assert mode(copies / "dropins" / "00-10-token.conf") == 0o600
    assert mode(mirror) == 0o700 and mode(mirror / "baseline.json") == 0o600 and mode(mirror / "ledger.jsonl") == 0o600
    state.record(L.Entry.step("r1", "stage", "ok"))
    assert mode(base) == 0o700
    got = state.read_baseline()
    assert got.modes == {str(live.unit): 0o644, str(live.dropin): 0o600}


def test_rollback_restores_each_file_with_the_mode_it_had(t, tmp_path, live):
    state = HostState(t, "h", SERVICE, root=tmp_path / "state")
    state.write_baseline(_baseline(live))
    baseline = state.read_baseline()
    live.dropin.write_bytes(b"[Service]\nEnvironment=HF_TOKEN=changed\n")
    live.unit.unlink()
    activation.restore_baseline_files(t, baseline)
    assert live.dropin.read_bytes().endswith(b"hf_secret\n") and mode(live.dropin) == 0o600
    assert mode(live.unit) == 0o644


# 5. Durability: fsync file and folder --------------------------------------------------------------
def _strace_log(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "(" in line]


def _fsynced(lines: list[str], path: str) -> list[int]:
    return [i for i, line in enumerate(lines) if re.search(r"\bf(data)?sync\(\d+<" + re.escape(path) + r">\)", line)]


def _renamed(lines: list[str], src: str, dest: str) -> list[int]:
    return [i for i, line in enumerate(lines) if "rename" in line and f'"{src}"' in line and f'"{dest}"' in line]


def _durable_write(lines: list[str], tmp: str, dest: str) -> bool:
    """fsync(tmp) before rename(tmp, dest), and fsync(folder) after it."""
    renames = _renamed(lines, tmp, dest)
    if not renames:
        return False
    r = renames[-1]
    return any(i < r for i in _fsynced(lines, tmp)) and any(i > r for i in _fsynced(lines, str(Path(dest).parent)))


STRACE = ["strace", "-f", "--seccomp-bpf", "-qq", "-y", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2"]
needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")


@needs_strace
def test_shell_builders_fsync_file_before_and_folder_after_the_rename(tmp_path):
    d = tmp_path / "a dir $(x) 'q'"
    d.mkdir()
    src, dest, link, ledger = d / "src", d / "50-fleetspec.conf", d / "current", d / "ledger.jsonl"
    src.write_text("[Service]\n")
    (d / "r1").mkdir()
    archive = d / "ledger-archive" / "ledger.1.jsonl"
    script = " && ".join([files.copy_atomic(str(src), str(dest)), files.symlink_atomic(str(d / "r1"), str(link)),
                          files.append_line(str(ledger), '{"x":1}'), files.append_line(str(ledger), '{"x":2}'),
                          files.drop_lines_script(str(ledger), str(archive), [(1, 1)])])
    log = tmp_path / "strace.log"
    subprocess.run([*STRACE, "-o", str(log), "sh", "-c", script], check=True)
    lines = _strace_log(log)
    # copy_atomic's copy is made in a fresh mktemp -d folder beside dest (no guessable name)
    made = [m for line in lines for m in re.findall(r'"(' + re.escape(str(d)) + r'/\.fleetspec-tmp\.\w{10}/f)"', line)]
    assert made and _durable_write(lines, made[-1], str(dest)), lines
    assert _renamed(lines, str(link) + files.TMP_SUFFIX, str(link)) and _fsynced(lines, str(d)), lines
    assert _fsynced(lines, str(ledger)), lines
    assert dest.read_text() == "[Service]\n" and os.readlink(link) == str(d / "r1")
    rotated = _renamed(lines, str(ledger) + files.TMP_SUFFIX, str(ledger))        # the ledger's rotation:
    assert _durable_write(lines, str(ledger) + files.TMP_SUFFIX, str(ledger)), lines
    assert any(i < rotated[-1] for i in _fsynced(lines, str(archive.parent))), lines  # the archive's name first
    assert ledger.read_text() == '{"x":2}\n' and archive.read_text() == '{"x":1}\n{"x":2}\n'


class _TracedSshd(conftest.Sshd):
    """The loopback sshd run under strace -f: every write the transport makes is seen by the kernel."""

    log: Path

    def start(self):
        self.log = self.workdir / "strace.log"
        wrapper = self.workdir / "sshd-traced"
        wrapper.write_text(f"#!/bin/sh\nexec {' '.join(STRACE)} -o {self.log} {conftest.SSHD} \"$@\"\n")
        wrapper.chmod(0o755)
        saved, conftest.SSHD = conftest.SSHD, str(wrapper)
        try:
            return super().start()
        finally:
            conftest.SSHD = saved

    def stop(self):
        pidfile = self.workdir / "sshd.pid"
        pid = int(pidfile.read_text()) if pidfile.is_file() else None
        super().stop()                   # strace's pid: it ends, and may leave the traced sshd running
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


@needs_strace
def test_baseline_ledger_and_drop_in_writes_are_fsynced_on_the_host(tmp_path_factory, ssh_client_key,
                                                                      inventory_writer, tmp_path, live):
    server = _TracedSshd(tmp_path_factory.mktemp("sshd-traced"), conftest.free_port(), ssh_client_key).start()
    try:
        host = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": server}, ssh_client_key)).hosts["h"]
        t = Transport(host)
        try:
            state = HostState(t, "h", SERVICE, root=tmp_path / "state")
            state.write_baseline(_baseline(live))
            state.record(L.Entry.step("r1", "switch", "started"))
            dropin = tmp_path / "etc" / f"{SERVICE}.d" / "50-fleetspec.conf"
            t.put_bytes(b"[Service]\n", str(dropin), mode=0o644)
        finally:
            t.close()
    finally:
        server.stop()
    lines = _strace_log(server.log)
    base = tmp_path / "state" / "sglang-test"
    tmp_baseline = base / ("baseline" + files.TMP_SUFFIX)
    for name in ("baseline.json", "unit", "dropins/00-10-token.conf"):
        tmp_file = [m for m in re.findall(r'"([^"]+\.fleetspec-tmp-[0-9a-f]+)"', "\n".join(lines))
                    if m.startswith(f"{tmp_baseline}/{name}.")]
        assert tmp_file and _durable_write(lines, tmp_file[0], f"{tmp_baseline}/{name}"), (name, lines)
    renames = _renamed(lines, str(tmp_baseline), str(base / "baseline"))
    assert renames and any(i > renames[-1] for i in _fsynced(lines, str(base))), lines
    assert _fsynced(lines, str(base / "ledger.jsonl")) and _fsynced(lines, str(base)), lines
    tmp_dropin = [m for m in re.findall(r'"([^"]+\.fleetspec-tmp-[0-9a-f]+)"', "\n".join(lines))
                  if m.startswith(f"{dropin}.")]
    assert tmp_dropin and _durable_write(lines, tmp_dropin[0], str(dropin)), lines


@needs_strace
def test_the_controller_mirror_is_written_0600_and_fsynced(tmp_path):
    mirror = tmp_path / "mirror"
    code = (f"from pathlib import Path; from fleetspec.ops.hoststate import write_private, append_private; "
            f"write_private(Path({str(mirror / 'baseline.json')!r}), b'{{}}'); "
            f"append_private(Path({str(mirror / 'ledger.jsonl')!r}), 'x\\n')")
    log = tmp_path / "strace.log"
    subprocess.run([*STRACE, "-o", str(log), sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[2])
    lines = _strace_log(log)
    tmp = [m for m in re.findall(r'"([^"]+baseline\.json\.tmp-\d+)"', "\n".join(lines))]
    assert tmp and _durable_write(lines, tmp[0], str(mirror / "baseline.json")), lines
    assert _fsynced(lines, str(mirror / "ledger.jsonl")), lines
    assert mode(mirror) == 0o700 and mode(mirror / "baseline.json") == mode(mirror / "ledger.jsonl") == 0o600
    write_private(mirror / "baseline.json", b"{}")          # and again in this process: still 0600
    append_private(mirror / "ledger.jsonl", "y\n")
    assert (mirror / "ledger.jsonl").read_text() == "x\ny\n" and mode(mirror / "baseline.json") == 0o600


@needs_strace
def test_rollback_sh_fsyncs_the_drop_in_and_the_current_flip(tmp_path):
    """rollback.sh (previous state: a release) run for real, with a systemctl that only records."""
    import hashlib

    from fleetspec.ops.rendering import _env

    state, etc, bin_ = tmp_path / "state", tmp_path / "etc", tmp_path / "bin"
    for d in (state / "releases" / "r0" / "unit", etc / f"{SERVICE}.d", bin_):
        d.mkdir(parents=True)
    previous_dropin = state / "releases" / "r0" / "unit" / "50-fleetspec.conf"
    previous_dropin.write_bytes(b"[Service]\nEnvironment=R=0\n")
    dropin = etc / f"{SERVICE}.d" / "zz-fleetspec.conf"
    dropin.write_bytes(b"[Service]\nEnvironment=R=1\n")
    unit = etc / SERVICE
    unit.write_bytes(b"[Service]\nExecStart=/bin/true\n")
    (state / "current").symlink_to(state / "releases" / "r1")
    (bin_ / "systemctl").write_text("#!/bin/sh\nexit 0\n")
    (bin_ / "systemctl").chmod(0o755)
    release = Release(id="r1", host="h", service=SERVICE, algo="ddtree", mode="release", sglang_version="x",
                      argv=["/bin/true"], previous="r0")
    root = Path(__file__).resolve().parents[2]
    text = _env(root).get_template("rollback.sh.j2").render(
        service=SERVICE, release=release, previous_label="r0", state_dir=str(state), dropin_path=str(dropin),
        previous_dropin=[str(previous_dropin)], previous_current=str(state / "releases" / "r0"),
        legacy_dropin_paths=[str(etc / f"{SERVICE}.d" / "50-fleetspec.conf")],
        previous_dropin_sha256=hashlib.sha256(previous_dropin.read_bytes()).hexdigest(),
        restore_files=[], remove_files=[], unit_sha256=hashlib.sha256(unit.read_bytes()).hexdigest(),
        unit_path=str(unit), sources=[])
    (tmp_path / "rollback.sh").write_text(text)
    log = tmp_path / "strace.log"
    r = subprocess.run([*STRACE, "-o", str(log), "sh", str(tmp_path / "rollback.sh"), "--reason", 'it "broke"'],
                       capture_output=True, text=True, env={"PATH": f"{bin_}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert dropin.read_bytes() == previous_dropin.read_bytes() and os.readlink(state / "current") == str(
        state / "releases" / "r0")
    lines = _strace_log(log)
    assert _durable_write(lines, f"{dropin}.fleetspec-tmp", str(dropin)), lines
    flip = _renamed(lines, str(state / "current.fleetspec-tmp"), str(state / "current"))
    assert flip and any(i > flip[-1] for i in _fsynced(lines, str(state))), lines
    notes = [json.loads(x) for x in (state / "ledger.jsonl").read_text().split("\n") if x]
    assert [n["detail"]["reason"] for n in notes] == ['it "broke"'] * 2 and _fsynced(lines, str(state / "ledger.jsonl"))


_NAME_CHARS = st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.sampled_from(["$(touch PWNED)", "`touch PWNED`", "-rf", "a b", "it's", "x\ny", "..."]),
                      st.text(alphabet=_NAME_CHARS, min_size=1, max_size=20)))
def test_durable_builders_with_hostile_file_names_write_exactly_their_file(tmp_path_factory, name):
    """copy_atomic, symlink_atomic, append_line and remove_durable_script, fsync steps included, run by a
    real shell on a file named with shell metacharacters, newlines, a leading '-': each does its
    one job and nothing else appears in the folder."""
    assume(name not in (".", ".."))
    d = tmp_path_factory.mktemp("hostile")
    src = d / "src"
    src.write_bytes(b"data\n")
    (d / "r1").mkdir()
    dest, link, ledger = d / f"c-{name}", d / f"l-{name}", d / f"j-{name}"
    script = " && ".join([files.copy_atomic(str(src), str(dest)), files.symlink_atomic(str(d / "r1"), str(link)),
                          files.append_line(str(ledger), name.replace("\n", " ")), files.remove_durable_script(str(src))])
    r = subprocess.run(["sh", "-c", script], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in d.iterdir()) == sorted(["r1", dest.name, link.name, ledger.name])
    assert dest.read_bytes() == b"data\n" and os.readlink(link) == str(d / "r1")
    assert ledger.read_bytes().decode() == name.replace("\n", " ") + "\n"  # bytes: read_text turns \r into \n

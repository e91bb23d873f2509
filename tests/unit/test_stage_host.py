"""The stage step's one command (remote/stage_host.py) against a real sshd, real shells and a real
python: only the objects the store lacks travel, on the command's own stdin; the release appears
whole under its final name or not at all; the smoke runner starts only on a published release;
secrets never reach a command line; a prestaged folder is reused only when it is byte for byte
what this stage would write."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import time
from pathlib import PurePosixPath
from types import SimpleNamespace

import pytest

from fleetspec.errors import RemoteError
from fleetspec.model import ledger as L
from fleetspec.model.layout import HostLayout
from fleetspec.ops.hoststate import HostState
from fleetspec.remote import background, files, stage_host
from fleetspec.remote.overlay import overlay_script

MOD = b"VALUE = 2\n"
KERNEL = b"\x7fELF not really" * 1000
SECRET = "s3cr3t-value-that-must-not-leak"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def site(tmp_path):
    """An installed package `pkg` whose mod.py the patch set replaces."""
    pkg = tmp_path / "site" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 1\n")
    (pkg / "other.py").write_text("OTHER = 1\n")
    return tmp_path / "site"


def _plan(tmp_path, site, *, name="r1", mod=MOD, then=None, reuse=False, manifest='{"id": "r1"}\n', secrets=f'K="{SECRET}"\n'):
    final = str(tmp_path / "state" / "releases" / name)
    tmp = final + files.TMP_SUFFIX
    patchset = SimpleNamespace(package="pkg", files=[SimpleNamespace(path="pkg/mod.py", sha256=sha(MOD))])
    return stage_host.Plan(
        store=str(tmp_path / "state" / "objects"), final=final, blobs={sha(mod): mod, sha(KERNEL): KERNEL},
        patch={"pkg/mod.py": sha(mod)}, kernels={"k.so": sha(KERNEL)},
        overlay=overlay_script(str(site), f"{tmp}/patch", f"{tmp}/overlay", patchset),
        compile=["overlay/pkg/mod.py"], manifest=manifest, secrets=secrets, reuse=reuse, then=then)


def _then(folder: str, rundir: str) -> stage_host.Then:
    code = "import sys; print(sys.stdin.read().upper())"
    return stage_host.Then(folder, background.start_script(folder, files.python_c(sys.executable, code, rundir=rundir),
                                                           timeout_s=60), "smoke input")


def _stage(t, tmp_path, plan):
    return stage_host.stage(t, sys.executable, str(tmp_path / "run"), plan, timeout=120)


def test_a_host_lacking_one_object_gets_only_that_one_in_the_same_command(t, tmp_path, site, seen):
    store = tmp_path / "state" / "objects"
    store.mkdir(parents=True)
    (store / sha(KERNEL)).write_bytes(KERNEL)              # the kernel is there, the patched module is not
    folder = str(tmp_path / "state" / "releases" / "r1" / "smoke")
    staged = _stage(t, tmp_path, _plan(tmp_path, site, then=_then(folder, str(tmp_path / "run"))))
    assert (staged.sent, staged.reused, staged.smoke_error) == (len(MOD), False, None)
    assert len(seen) == 1 and not any(w.startswith(("put ", "get ")) for w in seen), seen
    assert (store / sha(MOD)).read_bytes() == MOD
    rel = tmp_path / "state" / "releases" / "r1"
    assert (rel / "patch" / "pkg" / "mod.py").read_bytes() == MOD and (rel / "kernels" / "k.so").read_bytes() == KERNEL
    assert (rel / "overlay" / "pkg" / "mod.py").read_bytes() == MOD and (rel / "unit").is_dir()
    assert os.path.islink(rel / "overlay" / "pkg" / "other.py")
    assert list((rel / "overlay" / "pkg" / "__pycache__").glob("mod.*.pyc")), "py_compile wrote no bytecode"
    assert (rel / "manifest.json").read_text() == '{"id": "r1"}\n' and mode(rel / "manifest.json") == 0o644
    assert mode(rel / "secrets") == 0o700 and mode(rel / "secrets" / "env") == 0o600
    assert (rel / "secrets" / "env").read_text() == f'K="{SECRET}"\n'
    assert not os.path.exists(str(rel) + files.TMP_SUFFIX)
    assert SECRET not in "".join(seen), "a secret was on a command line"
    v = background.wait(t, folder, timeout=30)               # the runner started on the published release
    assert (v.rc, v.stdout.strip()) == (0, "SMOKE INPUT")


def test_a_store_that_has_every_object_gets_nothing_and_no_transfer(t, tmp_path, site, seen):
    _stage(t, tmp_path, _plan(tmp_path, site))
    seen.clear()
    staged = _stage(t, tmp_path, _plan(tmp_path, site, name="r2"))
    assert (staged.sent, staged.reused) == (0, False) and len(seen) == 1, seen
    assert (tmp_path / "state" / "releases" / "r2" / "overlay" / "pkg" / "mod.py").read_bytes() == MOD


def test_a_failed_check_leaves_no_release_and_starts_no_runner(t, tmp_path, site):
    """The store's copy does not hash as the patch set says (the overlay script's check): nothing
    under the final name, no temp folder left, and the runner never started."""
    folder = tmp_path / "state" / "releases" / "r1" / "smoke"
    plan = _plan(tmp_path, site, mod=b"VALUE = 666\n", then=_then(str(folder), str(tmp_path / "run")))
    with pytest.raises(RemoteError, match=r"staging .*r1 failed \(exit 1\): building the overlay exited 1"):
        _stage(t, tmp_path, plan)
    rel = tmp_path / "state" / "releases" / "r1"
    assert not rel.exists() and not os.path.exists(str(rel) + files.TMP_SUFFIX)


def test_a_module_that_does_not_compile_fails_the_stage(t, tmp_path, site):
    bad = b"def (\n"
    plan = _plan(tmp_path, site, mod=bad)
    plan.overlay = None                   # no hash check: py_compile is what refuses it
    plan.compile = ["patch/pkg/mod.py"]
    with pytest.raises(RemoteError, match="py_compile failed on the host"):
        _stage(t, tmp_path, plan)
    assert not (tmp_path / "state" / "releases" / "r1").exists()


def test_an_object_that_arrives_corrupted_is_refused(t, tmp_path, site):
    plan = _plan(tmp_path, site)
    plan.blobs[sha(MOD)] = b"VALUE = 3\n"        # what travels is not what its name says
    with pytest.raises(RemoteError, match="arrived with sha256"):
        _stage(t, tmp_path, plan)
    assert not (tmp_path / "state" / "objects" / sha(MOD)).exists()
    assert not (tmp_path / "state" / "releases" / "r1").exists()


def test_a_prestaged_folder_is_reused_only_while_manifest_and_secrets_match(t, tmp_path, site):
    _stage(t, tmp_path, _plan(tmp_path, site))
    rel = tmp_path / "state" / "releases" / "r1"
    (rel / "marker").write_text("from the prestage")
    folder = str(rel / "smoke")
    staged = _stage(t, tmp_path, _plan(tmp_path, site, reuse=True, then=_then(folder, str(tmp_path / "run"))))
    assert (staged.sent, staged.reused, staged.smoke_error) == (0, True, None)
    assert (rel / "marker").exists()                       # used as it is
    assert background.wait(t, folder, timeout=30).rc == 0
    for changed in (dict(secrets='K="rotated"\n'), dict(secrets=None), dict(manifest='{"id": "r1", "x": 1}\n')):
        staged = _stage(t, tmp_path, _plan(tmp_path, site, reuse=True, **changed))
        assert not staged.reused and not (rel / "marker").exists(), changed    # staged afresh, same id
        (rel / "marker").write_text("again")
    assert (rel / "manifest.json").read_text() == '{"id": "r1", "x": 1}\n'


def test_a_smoke_start_that_fails_is_reported_and_the_release_stays_published(t, tmp_path, site):
    then = stage_host.Then("/nonexistent/smoke", "echo no room >&2; exit 7", "")
    staged = _stage(t, tmp_path, _plan(tmp_path, site, then=then))
    assert staged.smoke_error and "no room" in staged.smoke_error
    assert (tmp_path / "state" / "releases" / "r1" / "manifest.json").exists()


def test_the_ledger_lines_ride_in_the_stage_command(t, tmp_path, site, seen):
    """Through a deploy's carrier the deferred lines are written before the stage's work, in the
    same command; a broken ledger (its folder a file) stops the stage before it starts."""
    state = HostState(t, "h", "svc.service")
    state.layout = HostLayout("svc.service", root=PurePosixPath(str(tmp_path / "state")))
    state.defer(L.Entry.step("r1", "stage", L.StepState.STARTED))
    _stage(state.carrier(), tmp_path, _plan(tmp_path, site))
    assert len(seen) == 1 and [e.name for e in state.ledger().entries] == ["stage"]
    base = tmp_path / "state" / "svc"
    os.rename(base, tmp_path / "moved")
    base.write_text("not a folder")
    state.defer(L.Entry.step("r2", "stage", L.StepState.STARTED))
    with pytest.raises(RemoteError, match="appending to"):
        _stage(state.carrier(), tmp_path, _plan(tmp_path, site, name="r2"))
    assert not (tmp_path / "state" / "releases" / "r2").exists()


def test_the_prestages_smoke_runner_is_kept_only_when_it_passed_or_runs_on_the_same_input(t, tmp_path, site):
    """A reused folder keeps the runner a prestage started there (its verdict is ready) only when
    that runner was fed this stage's input and passed or still runs; otherwise it runs again."""
    rel = tmp_path / "state" / "releases" / "r1"
    folder, runs = str(rel / "smoke"), tmp_path / "runs"

    gate = tmp_path / "gate"

    def then(stdin="smoke input", code="0", held=False):
        # held: the runner waits for the gate, so it is still running whatever the machine's speed
        wait = f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n" if held else ""
        src = (f"import os, sys, time\nopen({str(runs)!r}, 'a').write('x')\n{wait}"
               f"print(sys.stdin.read().upper()); sys.exit({code})")
        script = background.start_script(folder, files.python_c(sys.executable, src, rundir=str(tmp_path / "run")),
                                         timeout_s=60)
        return stage_host.Then(folder, script, stdin)

    def restage(th):
        return _stage(t, tmp_path, _plan(tmp_path, site, reuse=True, then=th))

    assert not _stage(t, tmp_path, _plan(tmp_path, site, then=then())).smoke_kept     # the prestage
    assert background.wait(t, folder, timeout=30).rc == 0
    staged = restage(then())
    assert (staged.reused, staged.smoke_kept, staged.smoke_error) == (True, True, None)
    assert runs.read_text() == "x" and background.wait(t, folder, timeout=30).stdout.strip() == "SMOKE INPUT"

    staged = restage(then(stdin="other input"))             # other smoke scripts: run again
    assert (staged.reused, staged.smoke_kept) == (True, False)
    assert background.wait(t, folder, timeout=30).stdout.strip() == "OTHER INPUT" and runs.read_text() == "xx"

    restage(then(code="1"))                                 # a runner that failed...
    assert background.wait(t, folder, timeout=30).rc == 1
    assert not restage(then(code="1")).smoke_kept           # ...is run again, never taken as a verdict
    background.wait(t, folder, timeout=30)
    assert runs.read_text() == "xxxx"

    restage(then(held=True))                                # still running: kept, its verdict awaited
    staged = restage(then(held=True))
    assert staged.smoke_kept and not os.path.exists(f"{folder}/rc")
    gate.touch()
    assert background.wait(t, folder, timeout=30).rc == 0 and runs.read_text() == "xxxxx"

    (rel / "manifest.json").write_text('{"id": "r1", "edited": true}\n')     # not reused: nothing kept
    staged = restage(then())
    assert (staged.reused, staged.smoke_kept) == (False, False)
    background.wait(t, folder, timeout=30)
    assert runs.read_text() == "xxxxxx"


def _cached_then(tmp_path, folder, key="k1", code="0"):
    """A runner that counts its runs and upper-cases its input, with a verdict cache beside the
    state as smoke_run.prepare sets one up (the site folder among what it watches)."""
    src = (f"import sys; open({str(tmp_path / 'runs')!r}, 'a').write('x'); "
           f"print(sys.stdin.read().upper()); print('at', {folder!r}); sys.exit({code})")
    script = background.start_script(folder, files.python_c(sys.executable, src, rundir=str(tmp_path / "run")),
                                      timeout_s=60, on_success=stage_host.keep_verdict(folder))
    cache = {"dir": str(tmp_path / "state" / "smoke-verdicts"), "key": key, "roots": [str(tmp_path / "site")]}
    return stage_host.Then(folder, script, "smoke input", cache)


def _runs(tmp_path) -> int:
    p = tmp_path / "runs"
    return len(p.read_text()) if p.exists() else 0


def test_a_passing_verdict_is_replayed_until_something_under_the_import_path_changes(t, tmp_path, site):
    """Release r2, same runner input and content: the verdict r1's runner left is replayed (the
    runner does not start, the folder reads as a run that passed); a file written under the
    watched site folder since then makes r3 run again, and r4 replays r3's. (A runner's verdict
    counts changes from a second before the second it started: each change here is 2 s older
    than the next run, or that run's own verdict would be distrusted too.)"""
    def stage(name):
        folder = str(tmp_path / "state" / "releases" / name / "smoke")
        staged = _stage(t, tmp_path, _plan(tmp_path, site, name=name, then=_cached_then(tmp_path, folder)))
        return staged, background.wait(t, folder, timeout=30)

    time.sleep(2)
    def said(name):
        return ["SMOKE INPUT", f"at {tmp_path}/state/releases/{name}/smoke"]

    staged, v = stage("r1")
    assert staged.smoke_reused is None and (v.rc, v.stdout.split("\n")[:2], _runs(tmp_path)) == (0, said("r1"), 1)
    entries = list((tmp_path / "state" / "smoke-verdicts").iterdir())
    assert len(entries) == 1 and mode(entries[0]) == 0o600 and mode(entries[0].parent) == 0o700
    staged, v = stage("r2")
    assert staged.smoke_reused["release"] == "r1" and _runs(tmp_path) == 1
    assert (v.rc, v.stdout.split("\n")[:2]) == (0, said("r2"))     # as r2's runner would have said it
    (site / "pkg" / "other.py").write_text("OTHER = 2\n")      # an operator's hand edit
    time.sleep(2)
    staged, v = stage("r3")
    assert staged.smoke_reused is None and _runs(tmp_path) == 2 and v.rc == 0
    staged, _ = stage("r4")
    assert staged.smoke_reused["release"] == "r3" and _runs(tmp_path) == 2
    (site / "pkg" / "new.py").write_text("")                   # a module added (pip install)
    time.sleep(2)
    assert stage("r5")[0].smoke_reused is None and _runs(tmp_path) == 3
    (site / "pkg" / "new.py").unlink()                         # one removed
    assert stage("r6")[0].smoke_reused is None and _runs(tmp_path) == 4


def test_a_failed_run_or_another_key_is_never_replayed(t, tmp_path, site):
    time.sleep(2)

    def stage(name, **kw):
        folder = str(tmp_path / "state" / "releases" / name / "smoke")
        staged = _stage(t, tmp_path, _plan(tmp_path, site, name=name, then=_cached_then(tmp_path, folder, **kw)))
        return staged, background.wait(t, folder, timeout=30)

    assert stage("r1", code="1")[1].rc == 1
    assert not list((tmp_path / "state" / "smoke-verdicts").iterdir())    # nothing kept of a failure
    staged, v = stage("r2", code="1")
    assert staged.smoke_reused is None and v.rc == 1 and _runs(tmp_path) == 2
    stage("r3")
    assert stage("r4", key="other tests")[0].smoke_reused is None and _runs(tmp_path) == 4
    for entry in (tmp_path / "state" / "smoke-verdicts").iterdir():
        entry.write_text("not a verdict\n")                     # damaged: run again, not trusted
    assert stage("r5")[0].smoke_reused is None and _runs(tmp_path) == 5


def test_a_prestages_passed_runner_is_not_kept_once_the_site_changed(t, tmp_path, site):
    """--prestage: the verdict its runner left is this deploy's only while nothing it imports from
    changed since it started (a pip install between the prestage and the deploy runs it again)."""
    time.sleep(2)
    folder = str(tmp_path / "state" / "releases" / "r1" / "smoke")
    _stage(t, tmp_path, _plan(tmp_path, site, then=_cached_then(tmp_path, folder)))      # the prestage
    assert background.wait(t, folder, timeout=30).rc == 0
    assert _stage(t, tmp_path, _plan(tmp_path, site, reuse=True, then=_cached_then(tmp_path, folder))).smoke_kept
    (site / "pkg" / "dep.py").write_text("")
    staged = _stage(t, tmp_path, _plan(tmp_path, site, reuse=True, then=_cached_then(tmp_path, folder)))
    assert (staged.reused, staged.smoke_kept, staged.smoke_reused) == (True, False, None)
    assert background.wait(t, folder, timeout=30).rc == 0 and _runs(tmp_path) == 2

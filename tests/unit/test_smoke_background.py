"""The smoke runner a deploy starts in the background (issue 17, "overlap"): a deploy that fails
before reading it, or dies and is abandoned by the next deploy, ends it; a reused pid is spared.
Real sshd on loopback, real shells, real processes; only the steps around it are stand-ins."""

from __future__ import annotations

import sys
import time
from pathlib import PurePosixPath
from types import SimpleNamespace

import pytest

from fleetspec.model import ledger as L
from fleetspec.model.inventory import load_inventory
from fleetspec.model.layout import HostLayout
from fleetspec.model.playbook import Smoke
from fleetspec.model.release import new_release_id
from fleetspec.ops import smoke_run
from fleetspec.ops.deploy import Deploy, DeployRequest, StepFailed
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.staging import abandon_unswitched
from fleetspec.remote import background, files
from fleetspec.remote.transport import Transport


@pytest.fixture
def host(sshd, ssh_client_key, inventory_writer, tmp_path):
    return load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key)).hosts["h"]


@pytest.fixture
def t(host):
    t = Transport(host)
    yield t
    t.close()


def _state(t, tmp_path) -> HostState:
    state = HostState(t, "h", "svc.service")
    state.layout = HostLayout("svc.service", root=PurePosixPath(str(tmp_path / "state")))
    return state


def _start_sleeper(t, state, rid) -> int:
    """A runner that would outlive the test by far: python sleeping 60 s in the release's folder."""
    folder = smoke_run.run_folder(state, rid)
    t.run(["mkdir", "-p", "--", str(state.layout.release(rid))], timeout=10, check=True)
    background.start(t, folder, files.python_c(sys.executable, "import time; time.sleep(60)",
                                               rundir=str(state.layout.run)), stdin=b"", timeout_s=120)
    return int(open(f"{folder}/pid").read())


def _alive(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return not f.read().rsplit(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return False


def _gone(pid, within=30.0) -> bool:
    """The runner's end, awaited as an event (a kill's effect comes when the machine gets to it);
    `within` stays far below the 60 s the runner would live unkilled."""
    end = time.monotonic() + within
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not _alive(pid)


def test_the_next_deploy_abandoning_a_dead_deploy_kills_its_smoke_runner(t, tmp_path):
    state = _state(t, tmp_path)
    dead = new_release_id("ddtree")
    state.record(L.Entry.step(dead, "stage", L.StepState.STARTED))
    state.record(L.Entry.status(dead, L.STAGED))
    pid = _start_sleeper(t, state, dead)
    assert _alive(pid)
    assert abandon_unswitched(state, "r-running") == [dead]
    assert _gone(pid), "the abandoned deploy's smoke runner still runs"
    assert state.ledger().releases()[dead] == L.FAILED


def test_a_deploy_failing_before_the_switch_kills_the_smoke_runner_it_started(t, host, tmp_path, monkeypatch):
    """render fails while the runner started by stage still runs: the deploy ends it, records the
    failure at render, and never reaches smoke or switch."""

    pf = SimpleNamespace(redact=lambda text: text, summary=lambda: {}, python=sys.executable, staged_ahead=None)
    started = {}

    def stage(self):
        started["pid"] = _start_sleeper(t, self.state, self.release_id)
        self.smoke_run = smoke_run.SmokeRun(smoke_run.run_folder(self.state, self.release_id), sys.executable,
                                            [("probe", "", None)])
        return {}

    def render(self):
        assert _alive(started["pid"])           # render runs while the smoke tests do
        raise StepFailed("render", "systemd-analyze verify refused the drop-in")

    monkeypatch.setattr(Deploy, "_record_preflight", lambda self: {})
    monkeypatch.setattr(Deploy, "_baseline", lambda self: {})
    monkeypatch.setattr(Deploy, "_stage", stage)
    monkeypatch.setattr(Deploy, "_render", render)
    d = Deploy(t, DeployRequest(host=host, playbook=SimpleNamespace(algo="ddtree", smoke=Smoke()), root=tmp_path),
               pf, echo=lambda line: None)
    d.state.layout = _state(t, tmp_path).layout
    out = d.run()
    assert (out.status, out.failed_step) == ("failed", "render"), out
    assert _gone(started["pid"]), "a failed deploy left its smoke runner running"
    names = [(e.name, e.state) for e in d.state.ledger().entries if e.release == d.release_id and e.kind == "step"]
    assert names[-1] == ("render", "failed") and ("smoke", "started") not in names


def test_a_prestaged_release_is_taken_only_while_the_ledger_still_calls_it_staged(t, tmp_path):
    """What `deploy --prestage` relies on, the ledger half (the stage command compares the manifest
    and secrets itself, tests/unit/test_stage_host.py): a release no ledger line calls "staged", or
    that another deploy has abandoned since, is staged again; the deploy passes the ledger its
    lock's holder read, else it is read here."""
    from fleetspec.ops.staging import still_staged

    state = _state(t, tmp_path)
    rid = new_release_id("ddtree")
    assert not still_staged(state, rid)                  # no ledger line: not ours to take
    state.record(L.Entry.status(rid, L.STAGED))
    assert still_staged(state, rid) and still_staged(state, rid, state.ledger())
    assert not still_staged(state, rid, L.parse(""))     # the ledger as read under the lock wins
    state.record(L.Entry.status(rid, L.FAILED, reason="interrupted before switch; host unchanged"))
    assert not still_staged(state, rid)                  # another deploy abandoned it


@pytest.mark.parametrize("raw", ["-1", "20", "ten", ""])
def test_a_bad_smoke_niceness_is_refused_in_one_line_before_any_host(raw, monkeypatch, tmp_path):
    import subprocess

    monkeypatch.setenv("FLEETSPEC_SMOKE_NICE", raw)
    r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(tmp_path), "deploy", "nohost", "--algo", "ddtree",
                        "--yes"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "FLEETSPEC_SMOKE_NICE" in r.stderr and "0 to 19" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_verdicts_key_ignores_the_release_folder_and_follows_every_input():
    """Two releases of the same content share a key (each has its own folder, named in the
    runner's PYTHONPATH and input); a changed argv, patch byte, kernel or sglang does not."""
    def key(rel="/s/releases/a", payload='[["parse", "argv = [\'--tp\', \'2\']; k = \'{r}/kernels\'"]]',
            patch=b"X = 1\n", kernels=None, version="0.5.13.post1"):
        cmd = files.python_c("/venv/bin/python3", "runner", env={"PYTHONPATH": f"{rel}/overlay"}, rundir="/s/run")
        return smoke_run.verdict_key(rel, "/venv/bin/python3", cmd, payload.replace("{r}", rel), {"m.py": patch},
                                     kernels or {}, "/venv/lib/site-packages", version)

    base = key()
    assert key(rel="/s/releases/b") == base
    assert key(payload='[["parse", "argv = [\'--tp\', \'4\']; k = \'{r}/kernels\'"]]') != base
    assert key(patch=b"X = 2\n") != base and key(kernels={"k.so": b"\x7fELF"}) != base
    assert key(version="0.5.23") != base


@pytest.mark.parametrize("reuse", [True, False])
def test_smoke_reuse_false_keeps_no_verdict_and_asks_for_none(tmp_path, reuse):
    """smoke.reuse: true gives the stage command a verdict cache (one key for two releases of the
    same content) and the runner the hook that keeps its verdict; false gives neither."""
    pf = SimpleNamespace(python="/venv/bin/python3", patchset=None, playbook=SimpleNamespace(smoke=Smoke(reuse=reuse)),
                         sglang=SimpleNamespace(site_packages="/venv/site", version="0.5.13.post1"), site_packages="/venv/site",
                         sglang_version="0.5.13.post1", container=None,
                         smoke_scripts=lambda kernels_dir: [("imports", f"print({kernels_dir!r})", None)],
                         patch_files=lambda: {}, kernel_files=lambda: {})
    state = _state(None, tmp_path)
    thens = [smoke_run.prepare(pf, state, rid)[1] for rid in ("r1", "r2")]
    if reuse:
        assert thens[0].cache["key"] == thens[1].cache["key"] and thens[0].cache["roots"] == ["/venv/site"]
        assert thens[0].cache["dir"] == str(state.layout.smoke_verdicts) and "FLEETSPEC_SMOKE_VERDICT" in thens[0].script
    else:
        assert thens[0].cache is None and "FLEETSPEC_SMOKE_VERDICT" not in thens[0].script

"""Deferred ledger lines riding in front of the next command (issue 17, one round trip per step),
against a real sshd on loopback, real flock and the real deploy lock.

The contract: the lines go out in the same remote shell, before the command's own work, in one
SSH command; the command's stdout, stderr and exit status are its own; when the prelude fails
(the lock is lost, the ledger cannot be written) nothing of the command runs and the failure is
charged to the step whose "ok" line it carried, else to the step it started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetspec.identity import ENV
from fleetspec.model import ledger as L
from fleetspec.model.playbook import Smoke
from fleetspec.ops.hoststate import PRELUDE_MARKER, HostState, LedgerWriteFailed
from fleetspec.remote.lock import LockLost, RemoteLock, force_unlock
from tests.unit.test_lock import until_stale


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setenv("FLEETSPEC_LOCK_HEARTBEAT_S", "0.1")
    monkeypatch.setenv("FLEETSPEC_LOCK_STALE_S", "1")


def _state(t, tmp_path, mirror=True) -> HostState:
    return HostState(t, "h", "svc.service", mirror=tmp_path / "mirror" if mirror else None, root=tmp_path / "state")


def _names(state):
    return [(e.name, e.state) for e in state.ledger().entries]


def test_deferred_lines_ride_in_front_of_the_next_command_which_keeps_its_own_output(t, tmp_path, seen):
    state = _state(t, tmp_path)
    marker = tmp_path / "ran"
    state.defer(L.Entry.step("R1", "stage", "ok"))
    state.defer(L.Entry.step("R1", "smoke", "started"))
    r = state.io.run_script(f"umask; [ -s {state.layout.ledger} ] && touch {marker}; echo out; echo err >&2; exit 3")
    assert (r.rc, r.stdout, r.stderr) == (3, "0022\nout\n", "err\n")     # the prelude's umask 077 stays in it
    assert marker.exists(), "the lines were not written before the command's own work"
    assert len(seen) == 1 and seen[0].startswith("umask;"), seen
    assert _names(state) == [("stage", "ok"), ("smoke", "started")] and not state.pending
    assert len((tmp_path / "mirror" / "ledger.jsonl").read_text().splitlines()) == 2
    assert state.io.run(["printf", "%s", "a b"]).stdout == "a b" and len(seen) == 3   # nothing pending: as is


def test_check_true_reads_the_commands_own_exit_status(t, tmp_path):
    state = _state(t, tmp_path)
    state.defer(L.Entry.step("R1", "render", "started"))
    with pytest.raises(Exception, match="exited 4") as err:
        state.io.run_script("exit 4", check=True)
    assert not isinstance(err.value, LedgerWriteFailed)
    assert _names(state) == [("render", "started")]


def test_a_ledger_that_cannot_be_written_stops_the_command_and_names_the_step(t, tmp_path, seen):
    state = _state(t, tmp_path)
    Path(state.layout.ledger).mkdir(parents=True)          # appending to it fails, as a full disk does
    marker = tmp_path / "ran"
    state.defer(L.Entry.step("R1", "stage", "ok"))
    state.defer(L.Entry.step("R1", "smoke", "started"))
    with pytest.raises(LedgerWriteFailed, match="appending to .*ledger.jsonl exited") as err:
        state.io.run_script(f"touch {marker}", check=True)
    assert err.value.charged_step == "stage"                 # it carried stage's "ok" line
    assert PRELUDE_MARKER not in str(err.value)
    assert not marker.exists(), "the command ran although its prelude failed"
    with pytest.raises(LedgerWriteFailed):                   # nothing more goes out through the carrier
        state.io.run_script(f"touch {marker}")
    assert not marker.exists() and len(seen) == 1


def test_a_failure_carrying_only_a_started_line_is_charged_to_that_step(t, tmp_path):
    state = _state(t, tmp_path, mirror=False)
    Path(state.layout.ledger).mkdir(parents=True)
    state.defer(L.Entry.step("R1", "probes", "started"))
    with pytest.raises(LedgerWriteFailed) as err:
        state.io.run(["true"])
    assert err.value.charged_step == "probes"


def test_a_lost_lock_stops_the_command_before_its_work(t, tmp_path, monkeypatch, fast):
    monkeypatch.setenv(ENV, "controller-aaaaaaaa")
    state = _state(t, tmp_path)
    lock = str(state.layout.lock)
    mine = RemoteLock(t, lock, release="r-a").__enter__()
    state.lock = mine
    marker = tmp_path / "ran"
    state.defer(L.Entry.step("R1", "baseline", "ok"))
    mine.stop_heartbeat()
    until_stale(t, lock, mine.holder)     # as the host sees it, in whole seconds
    monkeypatch.setenv(ENV, "controller-bbbbbbbb")
    force_unlock(t, lock)
    new = RemoteLock(t, lock, release="r-new").__enter__()
    try:
        with pytest.raises(LockLost, match="lost the lock") as err:
            state.io.run_script(f"touch {marker}")
        assert err.value.charged_step == "baseline"
        assert not marker.exists() and _state(t, tmp_path).ledger().entries == ()
    finally:
        new.__exit__(None, None, None)
        mine.__exit__(None, None, None)


def test_sftp_outside_the_state_root_sends_the_lines_first_inside_it_does_not(t, tmp_path, seen):
    state = _state(t, tmp_path)
    state.defer(L.Entry.step("R1", "stage", "started"))
    Path(state.layout.base).mkdir(parents=True)
    state.io.put_bytes(b"x", f"{state.layout.base}/object", durable=False)
    assert state.pending and not Path(state.layout.ledger).exists()
    outside = tmp_path / "etc-file"
    state.io.put_bytes(b"y", str(outside), durable=False)
    assert not state.pending and _names(state) == [("stage", "started")] and outside.read_bytes() == b"y"


def test_the_lock_holder_reads_the_ledger_once_it_holds_the_lock(t, tmp_path, seen):
    """Deploy's second ledger read (under the lock, after preflight's) costs no command of its own."""
    state = _state(t, tmp_path)
    with RemoteLock(t, str(state.layout.lock), release="r", read=str(state.layout.ledger)) as lock:
        assert lock.read_text is None                          # no ledger yet
    state.record(L.Entry.status("R0", L.STAGED))
    seen.clear()
    with RemoteLock(t, str(state.layout.lock), release="r", read=str(state.layout.ledger)) as lock:
        assert L.parse(lock.read_text).releases() == {"R0": L.STAGED}
        assert len(seen) == 1                                   # the holder's own command only


def test_a_deploy_whose_ledger_fails_at_the_next_steps_first_command_fails_the_step_it_carried(t, tmp_path, monkeypatch):
    """Deploy.step with the prelude: the write carrying baseline's "ok" fails (the ledger became
    unwritable during baseline), so the deploy stops there, charged to baseline, host unchanged."""
    from types import SimpleNamespace

    from fleetspec.ops import deploy as deploy_mod

    pf = SimpleNamespace(redact=lambda text: text, summary=lambda: {}, staged_ahead=None)
    ran = []

    def baseline_step(self):
        self.state.current()                                   # carries preflight ok + baseline started
        ledger = Path(self.state.layout.ledger)
        ledger.unlink()
        ledger.mkdir()                                         # every later append fails
        return {}

    monkeypatch.setattr(deploy_mod.Deploy, "_baseline", baseline_step)
    monkeypatch.setattr(deploy_mod.Deploy, "_stage", lambda self: ran.append(self.t.run_script("echo staged")))
    req = deploy_mod.DeployRequest(host=t.host, playbook=SimpleNamespace(algo="ddtree", smoke=Smoke()), root=tmp_path)
    d = deploy_mod.Deploy(t, req, pf, echo=lambda line: None)
    d.state.layout = _state(t, tmp_path).layout
    out = d.run()
    assert (out.status, out.exit_code, out.failed_step) == ("failed", 1, "baseline"), out
    assert "appending to" in out.reason and "not changed" in out.reason
    assert ran == []                                           # stage's command never ran

"""The deploy lock against a real sshd on loopback and real flock (issue 13, items 6 and 7).

Two controllers are two controller ids in one test process ($FLEETSPEC_CONTROLLER_ID), on one
hostname: exactly the cloned-VM / CI-runner case. Heartbeat and staleness are shortened by their
environment settings so a "session that stopped" is seconds old, not 30 s.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest

from fleetspec.errors import UserError
from fleetspec.identity import ENV, controller_id, machine_boot
from fleetspec.model import ledger as L
from fleetspec.model.inventory import load_inventory
from fleetspec.model.layout import HostLayout
from fleetspec.model.playbook import Smoke
from fleetspec.ops.hoststate import HostState
from fleetspec.remote.lock import LockLost, RemoteLock, force_unlock, is_held
from fleetspec.remote.lock_holder import Holder, heartbeat_age, heartbeat_path, read_holder, record_path, stale_after_s
from fleetspec.remote.transport import Transport

A, B = "controller-aaaaaaaa", "controller-bbbbbbbb"


@pytest.fixture(scope="module")
def host(sshd, ssh_client_key, inventory_writer, tmp_path_factory):
    inv = load_inventory(inventory_writer(tmp_path_factory.mktemp("inv") / "inv.yaml", {"h": sshd}, ssh_client_key))
    return inv.hosts["h"]


@pytest.fixture
def t(host):
    t = Transport(host)
    yield t
    t.close()


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setenv("FLEETSPEC_LOCK_HEARTBEAT_S", "0.1")
    monkeypatch.setenv("FLEETSPEC_LOCK_STALE_S", "1")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _holder(controller: str, pid: int, machine: str | None = None) -> Holder:
    """A holder recorded on this machine in this boot (machine_boot), as a RemoteLock here writes it."""
    return Holder(who="ci", machine=machine or socket.gethostname(), pid=pid, since=time.time(), release="r-held",
                  controller=controller, token=secrets.token_hex(16), boot=machine_boot())


def until_stale(t, lock: str, holder: Holder, within: float = 60) -> None:
    """Wait until the host reads `holder`'s heartbeat as stale (older than the stale limit, in the
    host's whole seconds): the state itself, awaited, rather than a sleep standing for it (a last
    heartbeat still in flight lands whenever the machine gets to it)."""
    end = time.monotonic() + within
    while (heartbeat_age(t, lock, holder) or 0.0) <= stale_after_s():
        assert time.monotonic() < end, f"{holder.token}'s heartbeat never went stale"
        time.sleep(0.1)


def backdate_heartbeat(lock: str, holder: Holder, seconds: float = 3600) -> float:
    """Make the heartbeat file look `seconds` old (the host is this machine): only a new heartbeat
    makes it fresh again. Returns the mtime set."""
    import os

    old = time.time() - seconds
    os.utime(heartbeat_path(lock, holder.token), (old, old))
    return old


def until_beat(lock: str, holder: Holder, since: float, within: float = 60) -> None:
    """Wait for a heartbeat written after `since` (the file's mtime moves past it)."""
    import os

    end = time.monotonic() + within
    while os.stat(heartbeat_path(lock, holder.token)).st_mtime <= since:
        assert time.monotonic() < end, "no heartbeat came"
        time.sleep(0.02)


def test_controller_id_is_made_once_kept_0600_and_reused(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    first = controller_id()
    path = tmp_path / "fleetspec" / "controller-id"
    assert path.read_text().strip() == first and len(first) == 32
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert controller_id() == first
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "other"))      # another controller
    assert controller_id() != first


def test_a_holder_from_another_controller_with_the_same_hostname_is_not_ended(t, tmp_path, monkeypatch):
    """6a: same hostname, its pid dead *here* means nothing: it is another controller's pid."""
    lock = str(tmp_path / "lock")
    monkeypatch.setenv(ENV, A)
    held = RemoteLock(t, lock, release="r-held", holder=_holder(A, _dead_pid()), heartbeat=False).__enter__()
    try:
        monkeypatch.setenv(ENV, B)
        with pytest.raises(UserError, match="is held by ci"):
            RemoteLock(t, lock, release="r-b").__enter__()
        assert is_held(t, lock) and read_holder(t, lock).token == held.holder.token
        monkeypatch.setenv(ENV, A)        # its own controller knows that pid is gone: ends it
        notes = []
        with RemoteLock(t, lock, release="r-a", note=notes.append) as mine:
            assert read_holder(t, lock).token == mine.holder.token
        assert any("ending a stale lock" in n for n in notes)
    finally:
        held.__exit__(None, None, None)


def test_unlock_force_refuses_a_holder_whose_session_is_alive_on_the_host(t, tmp_path, monkeypatch, fast):
    """6b: a holder from another machine whose session still beats on the host is not forced;
    once its heartbeats stop (its controller suspended, or its link cut) it is."""
    lock = str(tmp_path / "lock")
    monkeypatch.setenv(ENV, A)
    held = RemoteLock(t, lock, release="r-held", holder=_holder(A, 4242, machine="bastion.example")).__enter__()
    try:
        monkeypatch.setenv(ENV, B)
        # an hour old but for the heartbeats, which the host must see come: a stale limit no stall
        # of this machine reaches keeps the verdict theirs alone
        monkeypatch.setenv("FLEETSPEC_LOCK_STALE_S", "30")
        until_beat(lock, held.holder, backdate_heartbeat(lock, held.holder))
        with pytest.raises(UserError, match="still alive"):
            force_unlock(t, lock)
        assert is_held(t, lock)
        held.stop_heartbeat()
        monkeypatch.setenv("FLEETSPEC_LOCK_STALE_S", "1")
        until_stale(t, lock, held.holder)
        ended = force_unlock(t, lock)
        assert ended.token == held.holder.token and not is_held(t, lock)
    finally:
        held.__exit__(None, None, None)


def test_unlock_force_refuses_a_live_process_of_this_controller(t, tmp_path, monkeypatch, fast):
    lock = str(tmp_path / "lock")
    monkeypatch.setenv(ENV, A)
    sleeper = subprocess.Popen(["sleep", "60"])
    held = RemoteLock(t, lock, release="r", holder=_holder(A, sleeper.pid), heartbeat=False).__enter__()
    try:
        backdate_heartbeat(lock, held.holder)           # heartbeat stale, but the process is alive here
        with pytest.raises(UserError, match="still running"):
            force_unlock(t, lock)
    finally:
        sleeper.kill()
        sleeper.wait()
        held.__exit__(None, None, None)


def _state(t, tmp_path) -> HostState:
    state = HostState(t, "h", "svc.service")
    state.layout = HostLayout("svc.service", root=PurePosixPath(str(tmp_path / "state")))
    return state


def _steal(t, lock: str, old: RemoteLock, monkeypatch) -> RemoteLock:
    """Another controller forces the (now silent) holder out and takes the lock."""
    old.stop_heartbeat()
    until_stale(t, lock, old.holder)
    monkeypatch.setenv(ENV, B)
    assert force_unlock(t, lock).token == old.holder.token
    return RemoteLock(t, lock, release="r-new").__enter__()


def test_a_lost_lock_stops_the_next_step_and_release_keeps_the_new_holders_record(t, tmp_path, monkeypatch, fast):
    """6c and 6d at the HostState level: once stolen, a ledger line (each step starts with one)
    raises LockLost and writes nothing; leaving removes only our own record."""
    monkeypatch.setenv(ENV, A)
    state = _state(t, tmp_path)
    lock = str(state.layout.lock)
    mine = RemoteLock(t, lock, release="r-a").__enter__()
    state.lock = mine
    state.record(L.Entry.step("r-a", "stage", "started"))
    new = _steal(t, lock, mine, monkeypatch)
    try:
        with pytest.raises(LockLost, match="lost the lock"):
            state.record(L.Entry.step("r-a", "switch", "started"))
        assert [e.name for e in state.ledger().entries] == ["stage"]
        mine.__exit__(None, None, None)
        assert read_holder(t, lock).token == new.holder.token
        assert Path(record_path(lock, new.holder.token)).is_file() and is_held(t, lock)
        assert t.run_script(new.guard(), timeout=10).rc == 0          # the new holder still holds it
    finally:
        new.__exit__(None, None, None)
    assert not Path(record_path(lock, new.holder.token)).exists()


# Deploy under the lock (items 6c/6d and 7) ---------------------------------------------------------
class _Pf:
    """What Deploy.run reads of a preflight before `baseline`; the real preflight needs systemd."""

    staged_ahead = None          # no release `deploy --stage-only` left
    staged_ahead_older = ()

    def __init__(self, on_summary=lambda: None):
        self.on_summary = on_summary

    def redact(self, text):
        return text

    def summary(self):
        self.on_summary()
        return {}


def _deploy(t, host, tmp_path, monkeypatch, pf, baseline_step=None):
    from fleetspec.ops import deploy as deploy_mod
    if baseline_step is not None:
        monkeypatch.setattr(deploy_mod.Deploy, "_baseline", baseline_step)
    req = deploy_mod.DeployRequest(host=host, playbook=SimpleNamespace(algo="ddtree", smoke=Smoke()), root=tmp_path)
    d = deploy_mod.Deploy(t, req, pf, echo=lambda line: None)
    d.state.layout = _state(t, tmp_path).layout
    return d


def test_a_deploy_that_loses_its_lock_stops_before_the_next_step(t, host, tmp_path, monkeypatch, fast):
    monkeypatch.setenv(ENV, A)
    stolen = {}

    def baseline_step(self):          # while this step runs, another controller takes the lock
        self.state.current()          # the real step's first command: it carries the "started" line
        stolen["lock"] = _steal(t, str(self.state.layout.lock), self.lock, monkeypatch)
        return {}

    d = _deploy(t, host, tmp_path, monkeypatch, _Pf(), baseline_step)
    try:
        out = d.run()
        assert (out.status, out.exit_code, out.failed_step) == ("failed", 1, "baseline"), out
        assert "lost the lock" in out.reason and "not changed" in out.reason
        lines = [(e.name, e.state) for e in d.state.ledger().entries if e.release == d.release_id]
        assert lines[-1] == ("baseline", "started") and ("stage", "started") not in lines   # nothing after the theft
        assert read_holder(t, str(d.state.layout.lock)).token == stolen["lock"].holder.token
    finally:
        stolen["lock"].__exit__(None, None, None)


def test_an_interrupted_deploy_that_appears_before_the_lock_is_refused_under_it(t, host, tmp_path, monkeypatch):
    """7: the check is repeated under the lock: a deploy that switched and died between this one's
    preflight and its lock must not become its "previous good state"."""
    monkeypatch.setenv(ENV, A)
    d = None

    def sneak_in():                   # another deploy's story lands after preflight looked
        other = _state(t, tmp_path)
        other.record(L.Entry.status("20990101T000000Z-other", L.STAGED))
        other.record(L.Entry.status("20990101T000000Z-other", L.SWITCHED, previous="baseline"))

    pf = _Pf()
    d = _deploy(t, host, tmp_path, monkeypatch, pf,
                baseline_step=lambda self: pytest.fail("the baseline step ran after an interrupted switch"))
    monkeypatch.setattr("fleetspec.ops.deploy.RemoteLock.__enter__",
                        _wrap_enter(sneak_in), raising=True)
    out = d.run()
    assert (out.status, out.exit_code, out.failed_step) == ("needs_attention", 3, "preflight"), out
    assert "20990101T000000Z-other" in out.reason and out.evidence["command"] == f"fleetspec rollback {host.name}"
    assert d.state.ledger().releases()[d.release_id] == L.FAILED


def _wrap_enter(before):
    real = RemoteLock.__enter__

    def enter(self):
        before()
        return real(self)
    return enter


def test_a_steps_ok_line_travels_with_the_next_line_in_one_command_in_order(t, tmp_path):
    """Deferred ledger lines (Deploy.step's "ok") go out with the next record, in order, in one
    SSH command, and into the local mirror too; flush() writes what is left."""
    from fleetspec.remote import transport

    state = _state(t, tmp_path)
    state.mirror = tmp_path / "mirror"
    seen = []
    observer = lambda host, what, seconds, outcome: seen.append(what)
    transport.add_observer(observer)
    try:
        state.record(L.Entry.step("R1", "stage", "started"))
        state.defer(L.Entry.step("R1", "stage", "ok", seconds=0.1))
        state.defer(L.Entry.status("R1", L.STAGED))
        assert len(seen) == 1                                   # deferring sends nothing
        state.record(L.Entry.step("R1", "smoke", "started"))
        assert len(seen) == 2
        state.defer(L.Entry.step("R1", "smoke", "ok"))
        state.flush()
        state.flush()                                           # nothing left: no command
        assert len(seen) == 3
    finally:
        transport.remove_observer(observer)
    got = [(e.name, e.state) if e.kind == "step" else ("status", e.state) for e in state.ledger().entries]
    assert got == [("stage", "started"), ("stage", "ok"), ("status", L.STAGED), ("smoke", "started"), ("smoke", "ok")]
    assert len((state.mirror / "ledger.jsonl").read_text().splitlines()) == 5


def test_a_switched_deploy_in_flight_is_named_by_its_lock_not_called_interrupted(t, tmp_path, monkeypatch):
    """Preflight's read-only look (holder_first around its checks): a switched deploy whose
    controller still holds the lock (it is in its probes) is refused with the holder's name, never
    "interrupted, run rollback"; once the lock is free the same ledger is an interrupted deploy
    that needs a rollback."""
    from fleetspec.errors import NeedsAttention
    from fleetspec.ops.preflight_checks import check_interrupted, holder_first

    monkeypatch.setenv(ENV, A)
    state = _state(t, tmp_path)
    lock = str(state.layout.lock)
    state.record(L.Entry.status("20990101T000000Z-inflight", L.STAGED))
    state.record(L.Entry.status("20990101T000000Z-inflight", L.SWITCHED, previous="baseline"))
    held = RemoteLock(t, lock, release="20990101T000000Z-inflight").__enter__()
    try:
        monkeypatch.setenv(ENV, B)
        with pytest.raises(UserError, match=rf"{lock} is held by .*release 20990101T000000Z-inflight") as err:
            with holder_first(t, lock):
                check_interrupted(state, "h")
        assert not isinstance(err.value, NeedsAttention)
        with pytest.raises(UserError, match="bad input") as err:       # only NeedsAttention defers to the lock
            with holder_first(t, lock):
                raise UserError("bad input")
        assert "is held by" not in str(err.value)
    finally:
        held.__exit__(None, None, None)
    with pytest.raises(NeedsAttention, match="20990101T000000Z-inflight was interrupted"):
        with holder_first(t, lock):
            check_interrupted(state, "h")


def test_the_guard_holds_between_locked_and_the_holders_exec(t, tmp_path, monkeypatch):
    """The holder prints LOCKED and the ledger, then execs its `cat`; a step's guard sent the moment
    the ledger line arrived may find the holder shell not yet exec'd (a loaded host: the lost-lock
    refusals seen at 8 and 16 thin hosts). Held open here by a ledger that is a FIFO: the guard
    passes while the holder is that shell, and fails once the holder is gone."""
    import os

    from fleetspec.remote.lock import LOST, _read_line, acquire_script, guard_script

    monkeypatch.setenv(ENV, A)
    state = _state(t, tmp_path)
    lock, fifo = str(state.layout.lock), tmp_path / "ledger.fifo"
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    os.mkfifo(fifo)
    holder = _holder(A, os.getpid())
    chan = t.open_exec(acquire_script(lock, holder, read=str(fifo)))
    try:
        locked = _read_line(chan, timeout=30)
        assert locked.startswith("LOCKED"), locked
        pid = int(locked.split()[1])
        r = t.run_script(guard_script(lock, holder.token, pid) + "; echo guarded", timeout=30)
        assert r.rc == 0 and r.stdout.strip() == "guarded", (r.rc, r.stderr)
        other = _holder(A, os.getpid())
        assert t.run_script(guard_script(lock, other.token, pid), timeout=30).rc == LOST
    finally:
        with open(fifo, "w") as w:
            w.write("x\n")
        chan.close()
    deadline = time.monotonic() + 10
    while t.run_script(f"kill -0 {pid}", timeout=30).rc == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert t.run_script(guard_script(lock, holder.token, pid), timeout=30).rc == LOST

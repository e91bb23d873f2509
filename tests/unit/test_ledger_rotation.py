"""Rotating a host's ledger: a healthy deploy's last command moves the lines of pruned releases
out of a ledger grown past ROTATE_AT_BYTES, against a real sshd on loopback, the real deploy lock
and real sed/ln/mv. Nothing is ever lost: the old file stays whole in the archive, `history`
reads both, and every line the deploy still asks about stays in the ledger.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetspec.model import ledger as L
from fleetspec.ops import planning
from fleetspec.ops.hoststate import HostState
from fleetspec.remote import ledger_files
from fleetspec.remote.lock import RemoteLock, is_held

PAD = "x" * 120


def _entry(release: str, i: int, **kw) -> L.Entry:
    return L.Entry("step", release, f"step{i % 7}", "ok", ts=1_700_000_000.0 + i, by="ci@lab:1",
                   detail={"pad": PAD, **kw})


def _status(release: str, state: str, i: int) -> str:
    return L.Entry("status", release, "release", state, ts=1_700_000_000.0 + i, by="ci@lab:1").to_line()


def _big_ledger(releases: int, pruned: int) -> str:
    """A long-lived host's ledger: `releases` deploys of 20 lines each, interleaved as a fleet's
    ledger is (each later deploy prunes an older release), the first `pruned` of them PRUNED; a
    torn line and a baseline repair line among them."""
    lines, n = [], 0
    for r in range(releases):
        rid = f"R{r:03d}"
        for _ in range(20):
            lines.append(_entry(rid, n).to_line())
            n += 1
        lines.append(_status(rid, L.HEALTHY, n))
        if 0 < r <= pruned:
            lines.append(_status(f"R{r - 1:03d}", L.PRUNED, n))
        if r == 3:
            lines.append('{"kind": "step", "release": "R003", "na')                           # torn
            lines.append(L.Entry("step", "baseline", "repair", "ok", by="ci@lab:1").to_line())
    return "\n".join(lines) + "\n"


def test_below_the_threshold_nothing_moves_and_above_it_only_pruned_releases_lines_do():
    small = _big_ledger(3, 2)
    assert L.rotation(small) == []
    text = _big_ledger(160, 150)
    assert len(text) > L.ROTATE_AT_BYTES
    ranges = L.rotation(text)
    lines = text.split("\n")
    dropped = {n for a, b in ranges for n in range(a, b + 1)}
    for number, line in enumerate(lines, 1):
        release = json.loads(line)["release"] if line.startswith('{"by"') else None
        if number in dropped:
            assert release is not None and int(release[1:]) < 150, line
        elif release is not None and release != "baseline":
            assert int(release[1:]) >= 150, line
    assert any("repair" in lines[n - 1] for n in range(1, len(lines) + 1) if n not in dropped)
    assert any(lines[n - 1].endswith('"na') for n in range(1, len(lines) + 1) if n not in dropped)
    assert all(b >= a for a, b in ranges) and all(ranges[i][1] + 1 < ranges[i + 1][0] for i in range(len(ranges) - 1))


def _state(t, tmp_path) -> HostState:
    return HostState(t, "h", "svc.service", mirror=tmp_path / "mirror", root=tmp_path / "state")


def _seed(state: HostState, text: str) -> Path:
    ledger = Path(state.layout.ledger)
    ledger.parent.mkdir(parents=True, mode=0o700)
    ledger.write_text(text)
    ledger.chmod(0o600)
    return ledger


def test_a_healthy_deploys_last_command_rotates_a_long_ledger_and_history_still_reads_every_line(t, tmp_path, seen):
    state = _state(t, tmp_path)
    old = _big_ledger(160, 150)
    ledger = _seed(state, old)
    notes = []
    with RemoteLock(t, str(state.layout.lock), release="RNEW", read=str(ledger)) as lock:
        assert lock.read_text == old
        state.lock = lock
        state.defer(L.Entry.status("RNEW", L.HEALTHY))        # rides in front of the last command
        seen.clear()
        done = planning.prune_and_unlock(state.io, state, lock, ["R150"], note=notes.append)
        assert len(seen) == 1, seen                             # the rotation costs no command of its own
    assert done == ["R150"] and notes == []
    assert not is_held(t, str(state.layout.lock))

    archives = sorted(Path(state.layout.ledger_archive).iterdir())
    assert len(archives) == 1 and oct(archives[0].stat().st_mode & 0o777) == "0o600"
    assert oct(Path(state.layout.ledger_archive).stat().st_mode & 0o777) == "0o700"
    added = state.written[-2:]                                  # HEALTHY RNEW, then PRUNED R150
    assert archives[0].read_text() == old + "".join(line + "\n" for line in added)
    kept = [line for line in old.split("\n")[:-1] if not any(f'"release":"R{r:03d}"' in line for r in range(150))]
    assert ledger.read_text() == "\n".join(kept + added) + "\n"
    assert len(ledger.read_bytes()) < len(old) / 10 and oct(ledger.stat().st_mode & 0o777) == "0o600"

    now = state.ledger().releases()
    assert now == {**{f"R{r:03d}": L.HEALTHY for r in range(151, 160)}, "R150": L.PRUNED, "RNEW": L.HEALTHY}
    everything = L.parse(old + "".join(line + "\n" for line in added))
    history = state.ledger_with_archive()
    assert history.entries == everything.entries
    torn = [n for n, line in enumerate(ledger.read_text().split("\n"), 1) if line.endswith('"na')]
    assert list(history.skipped) == torn == list(state.ledger().skipped)   # numbered as in the ledger's file
    assert history.releases() == everything.releases()

    with RemoteLock(t, str(state.layout.lock), release="RNEXT", read=str(ledger)) as lock:   # now small: as is
        planning.prune_and_unlock(state.io, state, lock, [], note=notes.append)
    assert len(list(Path(state.layout.ledger_archive).iterdir())) == 1 and notes == []


def test_a_rotation_cut_off_after_its_link_leaves_every_line_once_for_history(t, tmp_path):
    """The state a power cut between `ln` and `mv` leaves: the ledger unchanged and the archive a
    second name for it. History shows each line once; the next rotation goes ahead."""
    state = _state(t, tmp_path)
    old = _big_ledger(160, 150)
    ledger = _seed(state, old)
    Path(state.layout.ledger_archive).mkdir(mode=0o700)
    os.link(ledger, Path(state.layout.ledger_archive) / "ledger.20260101T000000Z.jsonl")
    assert state.ledger_with_archive().entries == L.parse(old).entries
    notes = []
    with RemoteLock(t, str(state.layout.lock), release="RNEW", read=str(ledger)) as lock:
        planning.prune_and_unlock(state.io, state, lock, [], note=notes.append)
    assert len(list(Path(state.layout.ledger_archive).iterdir())) == 2 and notes == []
    assert state.ledger_with_archive().entries == L.parse(old).entries


def test_an_archive_name_already_taken_stops_the_rotation_before_any_change_and_is_noted(t, tmp_path, monkeypatch):
    state = _state(t, tmp_path)
    old = _big_ledger(160, 150)
    ledger = _seed(state, old)
    monkeypatch.setattr(planning.time, "strftime", lambda fmt, when=None: "20260101T000000Z")
    taken = Path(state.layout.ledger_archive) / "ledger.20260101T000000Z.jsonl"
    taken.parent.mkdir(mode=0o700)
    taken.write_text("someone else's\n")
    notes = []
    with RemoteLock(t, str(state.layout.lock), release="RNEW", read=str(ledger)) as lock:
        planning.prune_and_unlock(state.io, state, lock, [], note=notes.append)
    assert ledger.read_text() == old and taken.read_text() == "someone else's\n"
    assert not list(ledger.parent.glob("*.fleetspec-tmp"))
    assert len(notes) == 1 and "could not move old lines out of" in notes[0], notes
    assert not is_held(t, str(state.layout.lock))


@pytest.mark.parametrize("torn_tail", [False, True])
def test_lines_appended_after_the_read_stay_even_after_a_torn_last_line(t, tmp_path, torn_tail):
    state = _state(t, tmp_path)
    old = _big_ledger(160, 150) + ('{"kind":"st' if torn_tail else "")
    ledger = _seed(state, old)
    state.record(L.Entry.status("RLATE", L.STAGED))           # after the read, before the rotation
    script, archive = planning.rotation_script(state, old)
    r = t.run_script(script, timeout=30)
    assert r.rc == 0 and ledger_files.ROTATED_MARK in r.stdout, r
    assert ledger.read_text().endswith(state.written[-1] + "\n")
    assert state.ledger().releases()["RLATE"] == L.STAGED
    assert Path(archive).read_text().startswith(old)

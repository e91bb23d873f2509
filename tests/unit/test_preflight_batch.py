"""Preflight reads a host in one round trip (issue 17): gather_host batches the unit, its files and
baseline, the ledger, sglang, torch, disk, the model's config, the GPUs and the model paths through
status's batching (facts.gather_many), against the loopback sshd."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetspec.model.inventory import load_inventory
from fleetspec.ops import preflight, selection
from fleetspec.remote import facts, ledger_files
from fleetspec.remote.facts import file_text, missing_paths
from fleetspec.remote.transport import Transport


def _host(tmp_path, sshd, key, writer, **vars_):
    return load_inventory(writer(tmp_path / "inv.yaml", {"h": sshd}, key, **vars_)).hosts["h"]


def test_small_reads_ride_in_one_batch_with_exact_bytes(t, tmp_path, seen):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_bytes(b'{"a": 1}\n{"b": "no newline at the end"}')
    there, absent = tmp_path / "model dir", tmp_path / "gone 'quoted'"
    there.mkdir()
    text, none, missing = facts.gather_many(t, [
        (file_text, {"path": str(ledger)}), (file_text, {"path": str(tmp_path / "nothing")}),
        (missing_paths, {"paths": (str(there), str(absent))})], errors="raise")
    assert len(seen) == 1
    assert text == ledger.read_text() and none is None and missing == [str(absent)]


def test_gather_host_is_one_command_and_read_service_refuses_from_it(tmp_path, sshd, ssh_client_key,
                                                                     inventory_writer, seen):
    host = _host(tmp_path, sshd, ssh_client_key, inventory_writer)
    t = Transport(host)
    try:
        got = preflight.gather_host(t, host)
        assert len(seen) == 1, seen
        assert set(got) == {"unit", "files", "ledger", "sglang", "torch", "disk", "model", "gpus", "gpu_health",
                            "missing", "age", "env"}          # env: the manager's environment (busctl)
        assert got["missing"] == [] and got["ledger"] is None and got["disk"].free_bytes > 0
        # no systemd on this machine: the unit fact's own error is raised, as the unbatched read raised it
        assert isinstance(got["unit"], facts.FactError), got["unit"]
        with pytest.raises(facts.FactError, match="h: fact systemd failed"):
            preflight.read_service(t, host, None, tmp_path, got)
        assert len(seen) == 1, "read_service read again what the batch had"
    finally:
        t.close()


def test_the_deploys_prune_is_one_command(t, tmp_path, seen):
    """keep 1 of three healthy releases: the one `current` points at and the newest stay. The deploy
    knows the ledger and `current` (read under the lock), so nothing is read: one command removes
    the other release and appends its PRUNED line."""
    from fleetspec.model import ledger as L
    from fleetspec.ops import planning
    from fleetspec.ops.hoststate import HostState

    root = tmp_path / "state"
    base = root / "sglang-test"
    ids = ["20260101T000000Z-ddtree-0001", "20260102T000000Z-ddtree-0002", "20260103T000000Z-ddtree-0003"]
    for rid in ids:
        (base / "releases" / rid).mkdir(parents=True)
    (base / "current").symlink_to(base / "releases" / ids[0])
    (base / "ledger.jsonl").write_text("".join(L.Entry.status(r, L.HEALTHY).to_line() + "\n" for r in ids))
    state = HostState(t, "h", "sglang-test.service", root=root)
    old = planning.to_prune(state, (base / "ledger.jsonl").read_text(), ids[0], keep=1)
    script, lines = planning.prune_script(state, old)
    assert ledger_files.pruned_by(t.run_script(script).stdout, lines) == [ids[1]]
    assert len(seen) == 1, seen
    assert [(base / "releases" / r).is_dir() for r in ids] == [True, False, True]
    assert state.ledger().releases()[ids[1]] == L.PRUNED


def test_a_change_before_the_facts_is_read_by_them_and_stops_them_when_it_fails(t, tmp_path, seen):
    """gather_many(before=): switch's reload and its ExecStart read share one command."""
    import shlex

    from fleetspec.errors import RemoteError

    target = tmp_path / "written"
    got = facts.gather_many(t, [(file_text, {"path": str(target)})], errors="raise",
                            before=f"echo noise; printf new > {shlex.quote(str(target))}")
    assert got == ["new"] and len(seen) == 1
    with pytest.raises(RemoteError, match="exited 3"):
        facts.gather_many(t, [(file_text, {"path": str(target)})], errors="raise",
                          before=f"rm -- {shlex.quote(str(target))} && exit 3")
    assert not target.exists() and len(seen) == 2


@pytest.mark.sglang
def test_the_patch_sets_installed_sha256s_ride_in_the_batch(t, seen):
    """Issue 17: the batch cannot know the sglang version first, so the sglang fact hashes every
    path of every patch set the playbook names; the picked one's base check then reads nothing."""
    import hashlib
    from pathlib import Path
    from types import SimpleNamespace

    from fleetspec.errors import UserError
    from fleetspec.lab.envs import local_env
    from fleetspec.remote.facts import sglang as sglang_fact

    repo = Path(__file__).resolve().parents[2]
    versions = ("0.5.13.post1", "0.5.23")
    playbook = SimpleNamespace(patchsets={v: repo / f"playbooks/ddtree/patches/sglang-{v}" for v in versions})
    loaded = selection.preload_patchsets(playbook)
    paths = selection.candidate_paths(loaded)
    assert set(paths) == {f.path for v in versions for f in loaded[v].files}
    sg = facts.gather_many(t, [(sglang_fact, {"python": str(local_env("0.5.23")), "hash_paths": paths})],
                           errors="raise")[0]
    assert sg.version == "0.5.23" and set(sg.hashes) == set(paths)
    for path, digest in sg.hashes.items():
        f = Path(sg.site_packages) / path
        assert digest == (hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else None)
    seen.clear()
    assert selection.select_patchset(t, playbook, sg, "h", loaded) is loaded["0.5.23"]
    assert seen == []                                   # no command of its own
    added = next(f for f in loaded["0.5.23"].files if f.action == "add")   # a plugin: it adds files
    sg.hashes[added.path] = "0" * 64                    # an unknown file where it would go
    with pytest.raises(UserError, match=f"h: {added.path} exists on the host but not in sglang==0.5.23"):
        selection.select_patchset(t, playbook, sg, "h", loaded)
    sg.hashes = None                                    # not asked: read as before, one command
    assert selection.select_patchset(t, playbook, sg, "h", loaded) is loaded["0.5.23"] and len(seen) == 1


def test_a_deploys_prune_rides_with_its_last_lines_and_the_locks_release(t, tmp_path, seen):
    """Issue 17: what to prune comes from the ledger read under the lock plus this deploy's own
    lines (no read); removing, recording PRUNED and dropping the lock's files is the one command
    that carries the deferred HEALTHY line."""
    from fleetspec.model import ledger as L
    from fleetspec.ops import planning
    from fleetspec.ops.hoststate import HostState
    from fleetspec.remote.lock import RemoteLock
    from fleetspec.remote.lock_holder import holders_dir

    root = tmp_path / "state"
    base = root / "sglang-test"
    ids = ["20260101T000000Z-ddtree-0001", "20260102T000000Z-ddtree-0002", "20260103T000000Z-ddtree-0003"]
    for rid in ids:
        (base / "releases" / rid).mkdir(parents=True)
    (base / "ledger.jsonl").write_text("".join(L.Entry.status(r, L.HEALTHY).to_line() + "\n" for r in ids[:2]))
    state = HostState(t, "h", "sglang-test.service", root=root, mirror=tmp_path / "mirror")
    with RemoteLock(t, str(state.layout.lock), release=ids[2], **state.lock_reads) as lock:
        state.lock = lock
        state.record(L.Entry.status(ids[2], L.STAGED))
        state.defer(L.Entry.status(ids[2], L.HEALTHY))
        old = planning.to_prune(state, lock.read_text, ids[2], keep=1, protect=[ids[1]])
        assert old == [ids[0]]                            # not the newest, not the one it came from
        seen.clear()
        assert planning.prune_and_unlock(state.io, state, lock, old, note=pytest.fail) == [ids[0]]
        assert len(seen) == 1, seen
        assert list(Path(holders_dir(str(state.layout.lock))).iterdir()) == []
    assert [(base / "releases" / r).is_dir() for r in ids] == [False, True, True]
    releases = state.ledger().releases()
    assert releases == {ids[0]: L.PRUNED, ids[1]: L.HEALTHY, ids[2]: L.HEALTHY}
    assert L.parse((tmp_path / "mirror" / "ledger.jsonl").read_text()).releases()[ids[0]] == L.PRUNED


def test_a_release_that_cannot_be_pruned_is_a_note_and_the_lock_files_still_go(t, tmp_path, seen):
    """rm fails on one release (an immutable file in it): that one keeps its folder and gets no
    PRUNED line, the other is pruned, the deploy only hears a note, and the lock's files go."""
    import subprocess

    from fleetspec.model import ledger as L
    from fleetspec.ops import planning
    from fleetspec.ops.hoststate import HostState
    from fleetspec.remote.lock import RemoteLock
    from fleetspec.remote.lock_holder import holders_dir

    root = tmp_path / "state"
    base = root / "sglang-test"
    ids = ["20260101T000000Z-ddtree-0001", "20260102T000000Z-ddtree-0002"]
    for rid in ids:
        (base / "releases" / rid).mkdir(parents=True)
    stuck = base / "releases" / ids[0] / "stuck"
    stuck.write_text("x")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    notes = []
    try:
        state = HostState(t, "h", "sglang-test.service", root=root)
        with RemoteLock(t, str(state.layout.lock), release="r", **state.lock_reads) as lock:
            state.lock = lock
            state.defer(L.Entry.status("r", L.HEALTHY))
            assert planning.prune_and_unlock(state.io, state, lock, ids, note=notes.append) == [ids[1]]
            assert list(Path(holders_dir(str(state.layout.lock))).iterdir()) == []
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    assert len(notes) == 1 and f"could not prune {ids[0]}" in notes[0] and "stuck" in notes[0], notes
    assert (base / "releases" / ids[0]).is_dir() and not (base / "releases" / ids[1]).exists()
    assert state.ledger().releases() == {"r": L.HEALTHY, ids[1]: L.PRUNED}


def test_a_restaged_release_supersedes_the_older_one_and_superseded_ones_are_pruned(t, tmp_path):
    """Releases a benchmark or a second `--stage-only` left behind are never switched to: the older
    staged one becomes superseded, and superseded ones count with the failed for pruning (the newest
    `keep` stay for forensics), so a host that stages or benchmarks often does not fill its disk."""
    from fleetspec.model import ledger as L
    from fleetspec.ops import planning
    from fleetspec.ops.hoststate import HostState

    root = tmp_path / "state"
    base = root / "sglang-test"
    base.mkdir(parents=True)
    bench = [f"2026010{i}T000000Z-ddtree-000{i}" for i in range(1, 5)]
    staged = ["20260105T000000Z-ddtree-0005", "20260106T000000Z-ddtree-0006"]
    lines = [L.Entry.status(r, L.SUPERSEDED, reason="benchmark run") for r in bench]
    lines += [L.Entry.status(r, L.STAGED, ahead=True, algo="ddtree") for r in staged]
    (base / "ledger.jsonl").write_text("".join(e.to_line() + "\n" for e in lines))
    state = HostState(t, "h", "sglang-test.service", root=root)
    before = state.ledger()
    assert before.staged_ahead("ddtree") == staged
    state.supersede_staged(before.staged_ahead("ddtree")[:-1], staged[-1])
    after = state.ledger()
    assert after.staged_ahead("ddtree") == [staged[-1]]
    assert after.releases()[staged[0]] == L.SUPERSEDED
    # four benchmark releases and the restaged one: the newest three stay, the staged one is kept
    assert planning.prune_candidates(after.releases(), None, keep=3) == bench[:2]

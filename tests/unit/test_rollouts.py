"""Rollouts as records: the id, the record format on disk, its lock, pause and promote through
the fleet loop, the id in ledger lines, `rollback --to previous` and a fleet rollback's batches.

The fleet loop's choices are what is tested here; the deploys and rollbacks of a host are stood
in for (tests/lab/test_rollout_control.py drives them for real)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from fleetspec.errors import ConfigError, UserError
from fleetspec.model import ledger as L
from fleetspec.model.rollout import Record, is_rollout_id, new_rollout_id, pauses_after
from fleetspec.ops import fleet, rollouts
from fleetspec.ops.deploy import DeployOutcome
from fleetspec.ops.history import of_rollout, releases
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.rollback import previous_of


def test_an_id_is_short_sorts_by_time_and_is_never_a_path():
    early, late = new_rollout_id(1_700_000_000), new_rollout_id(1_700_000_001)
    assert is_rollout_id(early) and len(early) == 20 and early[:15] == "20231114-221320"
    assert sorted([late, early]) == [early, late]
    for bad in ("../x", "20231114-221320-3af1/..", "20231114-221320-3AF1", "", None, "20231114T221320Z-ddtree-3af1"):
        assert not is_rollout_id(bad)


def _record(tmp_path, **fields) -> Record:
    fields = {"strategy": {"canary": 1, "serial": 1, "max_fail": 0, "parallel": 0,
                           "rollback_all_on_abort": False, "prestage": False}, "algo": "ddtree", **fields}
    return rollouts.create(tmp_path, rollouts.new_record("deploy", [["a"], ["b"], ["c"]],
                                                         ["fleetspec", "deploy", "a", "b", "c"], **fields))


def test_a_record_is_written_whole_and_read_back_as_written(tmp_path):
    record = _record(tmp_path, pause_after="canary", sets=["budget=32"])
    path = rollouts.record_path(tmp_path, record.id)
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert not list(path.parent.glob("*.tmp-*"))                     # renamed into place, nothing left over
    back = rollouts.load(tmp_path, record.id)
    assert back == record and json.loads(path.read_text())["version"] == 1
    assert rollouts.find(tmp_path, record.id[-4:]) == record.id      # its random end is enough
    with pytest.raises(UserError, match="not a rollout id"):
        rollouts.load(tmp_path, "../../etc/passwd")


def test_a_record_that_is_not_one_is_refused_naming_the_file_and_listed_as_a_warning(tmp_path):
    record = _record(tmp_path)
    path = rollouts.record_path(tmp_path, record.id)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "state": "exploded"}))
    with pytest.raises(ConfigError, match=f"{path}.*state"):
        rollouts.load(tmp_path, record.id)
    other = _record(tmp_path)
    found, bad = rollouts.all_records(tmp_path)
    assert [r.id for r in found] == [other.id] and len(bad) == 1 and str(path) in bad[0]


def test_two_holders_of_one_rollout_cannot_run_at_once_and_the_lock_dies_with_its_process(tmp_path):
    """A second process holds the rollout's lock: this one is refused at once; once that process
    is gone (it was told to end, no sleep), the lock is free."""
    record = _record(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from fleetspec.ops import rollouts\n"
         f"with rollouts.held(Path({str(tmp_path)!r}), {record.id!r}, 'x'):\n"
         "    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"rollout {record.id} is held by another fleetspec process"):
            with rollouts.held(tmp_path, record.id, "this promote"):
                pass
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    with rollouts.held(tmp_path, record.id, "this promote"):
        with pytest.raises(UserError):                                # nor twice in one process
            with rollouts.held(tmp_path, record.id, "another"):
                pass


def test_pause_points():
    assert pauses_after("canary", 0, 3, canary=True) and not pauses_after("canary", 1, 3, canary=True)
    assert not pauses_after("canary", 0, 3, canary=False)
    assert pauses_after("each-batch", 1, 3, canary=False) and not pauses_after("each-batch", 2, 3, canary=False)
    assert not pauses_after(None, 0, 3, canary=True)


def _stand_in_deploys(monkeypatch, results):
    seen = []

    def one(h, *a, rollout=None, **k):
        seen.append((h.name, rollout))
        return results[h.name]
    monkeypatch.setattr(fleet, "deploy_one", one)
    return seen


def test_a_paused_rollout_waits_then_goes_on_with_its_batches_and_failure_budget(monkeypatch, tmp_path):
    hosts = [SimpleNamespace(name=n) for n in ("a", "b", "c")]
    results = {n: DeployOutcome(n, "healthy", f"R-{n}", previous="baseline") for n in "abc"}
    seen = _stand_in_deploys(monkeypatch, results)
    record = _record(tmp_path, pause_after="canary")
    strategy = fleet.Strategy(**record.strategy)
    out = rollouts.run_deploy(tmp_path, record, hosts, None, connect=lambda h: None, options={}, strategy=strategy,
                              echo=lambda line: None, progress=lambda line: None)
    assert [(o.host, o.status, o.exit_code) for o in out] == [("a", "healthy", 0), ("b", "pending", 0),
                                                               ("c", "pending", 0)]
    assert seen == [("a", record.id)]
    stored = rollouts.load(tmp_path, record.id)                      # what another shell's promote reads
    assert stored.state == "paused" and stored.next_batch == 1 and stored.changed() == ["a"]
    rollouts.promotable(stored)

    results["b"] = DeployOutcome("b", "rolled_back", "R-b", failed_step="gates", exit_code=1, previous="baseline")
    out = rollouts.run_deploy(tmp_path, stored, hosts, None, connect=lambda h: None, options={}, strategy=strategy,
                              echo=lambda line: None, progress=lambda line: None)
    assert [(o.host, o.status) for o in out] == [("b", "rolled_back"), ("c", "skipped")]    # max-fail 0
    assert [name for name, _ in seen] == ["a", "b"]
    final = rollouts.load(tmp_path, record.id)
    assert final.state == "failed" and final.hosts["a"].status == "healthy" and final.failures == 1
    with pytest.raises(UserError, match="only a paused deploy can be promoted"):
        rollouts.promotable(final)


def test_each_ledger_line_names_its_rollout_and_older_ledgers_read_as_before():
    state = HostState(None, "h", "svc.service", rollout="20261205-001526-3af1")
    lines = state._lines([L.Entry.step("R1", "stage", "started"), L.router_entry("drained", "r", "w")])
    first, router = (json.loads(x)["detail"] for x in lines)
    assert first["rollout"] == "20261205-001526-3af1" and "rollout" not in router
    old = L.render([L.Entry.step("R0", "stage", "started"), L.Entry.status("R0", L.HEALTHY)])
    parsed = L.parse(old + "".join(x + "\n" for x in lines))
    assert [(r.id, r.rollout) for r in releases(parsed)] == [("R0", None), ("R1", "20261205-001526-3af1")]
    assert [r.id for r in of_rollout(parsed, "20261205-001526-3af1")] == ["R1"]


def _ledger(*entries) -> L.ParsedLedger:
    return L.parse(L.render(entries))


def test_rollback_to_previous_is_what_the_current_release_replaced():
    a, b = "20261201T000000Z-nextn-aaaa", "20261202T000000Z-ddtree-bbbb"
    led = _ledger(L.Entry.status(a, L.SWITCHED, previous="baseline"), L.Entry.status(a, L.HEALTHY),
                  L.Entry.status(b, L.SWITCHED, previous=a), L.Entry.status(b, L.HEALTHY))
    assert previous_of(led, b, "h") == a and previous_of(led, a, "h") == "baseline"
    with pytest.raises(UserError, match="runs its baseline"):
        previous_of(led, None, "h")
    pruned = _ledger(*led.entries, L.Entry.status(a, L.PRUNED))
    with pytest.raises(UserError, match=f"replaced {a}, which is pruned now; targets: baseline"):
        previous_of(pruned, b, "h")


def test_a_fleet_rollback_runs_parallel_within_a_batch_and_stops_past_max_fail(monkeypatch, tmp_path):
    hosts = [SimpleNamespace(name=n) for n in ("a", "b", "c", "d")]
    together = threading.Barrier(2, timeout=60)          # passes only when both hosts of a batch run at once

    def stand_in(t, h, root, to, **k):
        together.wait()
        if h.name == "b":
            raise UserError("b: no baseline recorded")
        return SimpleNamespace(to_json=lambda: {"host": h.name, "status": "rolled_back", "target": "baseline",
                                                "exit_code": 0})
    monkeypatch.setattr("fleetspec.ops.rollback.rollback", stand_in)
    strategy = fleet.Strategy.parse(4, canary=0, serial="2", max_fail="0", parallel=0, rollback_all_on_abort=False)
    rows, code = fleet.rollback_fleet(hosts, None, connect=lambda h: None, root=tmp_path, echo=lambda line: None,
                                      strategy=strategy)
    assert [(r["host"], r["status"]) for r in rows] == [("a", "rolled_back"), ("b", "error"), ("c", "skipped"),
                                                        ("d", "skipped")]
    assert code == 2


def _cli(root, *args):
    from click.testing import CliRunner

    from fleetspec.cli import main

    return CliRunner().invoke(main, ["--root", str(root), *args])


@pytest.fixture
def fleet_root(tmp_path):
    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    (tmp_path / "inventory" / "lab.yaml").write_text("hosts:\n  a: {address: 127.0.0.1, port: 1}\n")
    return tmp_path


def test_rollouts_lists_and_shows_records_and_refuses_what_cannot_go_on_in_one_line(fleet_root):
    assert _cli(fleet_root, "rollouts").output.strip() == "no rollouts yet"
    record = _record(fleet_root, pause_after="canary")
    assert "cut off" in _cli(fleet_root, "rollouts").output      # `running`, and no process holds its lock
    with rollouts.held(fleet_root, record.id, "x"):
        assert "running" in _cli(fleet_root, "rollouts").output
    record.state = "done"
    rollouts.save(fleet_root, record)
    listed = _cli(fleet_root, "rollouts")
    assert listed.exit_code == 0 and record.id in listed.output and "deploy ddtree" in listed.output
    shown = json.loads(_cli(fleet_root, "rollouts", "show", record.id[-4:], "--json").output)
    assert shown["id"] == record.id and shown["batches"] == [["a"], ["b"], ["c"]]
    for args, said in ((["promote", record.id, "--yes"], "only a paused deploy can be promoted"),
                       (["promote", "nope", "--yes"], "no rollout 'nope'"),
                       (["deploy", "a", "--algo", "ddtree", "--pause-after", "canary", "--yes"],
                        "--pause-after canary needs --canary N")):
        result = _cli(fleet_root, *args)
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and said in lines[0], result.output
    assert [p.name for p in rollouts.folder(fleet_root).glob("*.json")] == [f"{record.id}.json"]   # none made


def test_rollback_all_on_abort_also_puts_back_the_hosts_an_earlier_process_of_the_rollout_moved(monkeypatch, tmp_path):
    """a went in the first process (paused after it); b fails in the promote: a goes back to what
    it ran before the rollout, once (b reverted itself), and the record says so."""
    hosts = [SimpleNamespace(name=n) for n in ("a", "b", "c")]
    results = {"a": DeployOutcome("a", "healthy", "R-a", previous="R-a-old"),
               "b": DeployOutcome("b", "healthy", "R-b", previous="baseline"),
               "c": DeployOutcome("c", "healthy", "R-c", previous="baseline")}
    _stand_in_deploys(monkeypatch, results)
    went = []
    monkeypatch.setattr("fleetspec.ops.rollback.rollback", lambda t, h, root, to, **k: went.append((h.name, to)) or
                        SimpleNamespace(to_json=lambda: {"host": h.name, "status": "rolled_back"}))
    record = _record(tmp_path, pause_after="canary")
    record.strategy["rollback_all_on_abort"] = True
    strategy = fleet.Strategy(**record.strategy)
    go = dict(connect=lambda h: None, options={}, strategy=strategy, echo=lambda line: None,
              progress=lambda line: None)
    rollouts.run_deploy(tmp_path, record, hosts, None, **go)
    results["b"] = DeployOutcome("b", "rolled_back", "R-b", failed_step="probes", exit_code=1, previous="baseline")
    rollouts.run_deploy(tmp_path, rollouts.load(tmp_path, record.id), hosts, None, **go)
    assert went == [("a", "R-a-old")]
    final = rollouts.load(tmp_path, record.id)
    assert final.state == "failed" and final.hosts["a"].status == "rolled_back" and final.hosts["c"].status == "skipped"


def test_promote_goes_on_with_the_stored_playbook_and_refuses_one_that_changed(monkeypatch, tmp_path):
    import hashlib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    for sub in ("inventory", "templates"):
        (tmp_path / sub).mkdir()
    (tmp_path / "playbooks").symlink_to(repo / "playbooks")
    digest = hashlib.sha256((repo / "playbooks" / "ddtree.yaml").read_bytes()).hexdigest()
    seen = _stand_in_deploys(monkeypatch, {n: DeployOutcome(n, "healthy", f"R-{n}", previous="baseline")
                                           for n in "abc"})
    hosts = {n: SimpleNamespace(name=n) for n in "abc"}
    go = dict(select=lambda names: [hosts[n] for n in names], connect=lambda h: None, echo=lambda line: None,
              progress=lambda line: None)
    record = _record(tmp_path, pause_after="each-batch", playbook_sha256=digest, sets=["budget=32"])
    record.state, record.next_batch = "paused", 1
    rollouts.save(tmp_path, record)
    after, out = rollouts.promote(tmp_path, record.id, **go)
    assert [(o.host, o.status) for o in out] == [("b", "healthy"), ("c", "pending")]   # paused again
    assert after.state == "paused" and [h for h, _ in seen] == ["b"]
    changed = _record(tmp_path, playbook_sha256="0" * 64)
    changed.state, changed.next_batch = "paused", 1
    rollouts.save(tmp_path, changed)
    with pytest.raises(UserError, match="changed since rollout"):
        rollouts.promote(tmp_path, changed.id, **go)
    assert [h for h, _ in seen] == ["b"]                          # nothing ran

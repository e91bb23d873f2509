"""Operator control of a rollout on thin lab hosts (engines that import nothing, so each deploy is
quick): a canary paused and promoted from a second process, a paused rollout aborted back to the
exact unit bytes, and `rollback --to previous` over two kept releases. Every test leaves the
hosts on their baselines."""

from __future__ import annotations

import json

import pytest

from tests.lab.labtools import fs, json_rows, ledger

pytestmark = [pytest.mark.lab]

CURRENT = "readlink /var/lib/fleetspec/sglang-qwen/current"


@pytest.fixture
def thin(thin_fleet):
    def reset():
        for host in thin_fleet.hosts:
            fs(thin_fleet, "lab", "fault", host, "--clear", check_rc=0)
            if thin_fleet.run(host, CURRENT).returncode == 0:
                fs(thin_fleet, "rollback", host, check_rc=0)
    reset()
    yield thin_fleet
    reset()


def _unit(fleet, host) -> str:
    """The unit as systemd reads it: its file and every drop-in, bytes and paths."""
    r = fleet.run(host, "systemctl cat sglang-qwen")
    assert r.returncode == 0, r.stderr
    return r.stdout.decode()


def _record(fleet, rid) -> dict:
    return json.loads(fs(fleet, "rollouts", "show", rid, "--json", check_rc=0).stdout)


def _deploy(fleet, *args):
    r = fs(fleet, "deploy", *args, "--algo", "ddtree", "--no-gates", "--yes", "--json")
    rows = json_rows(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {o["host"]: o for o in rows}


def test_a_paused_canary_is_promoted_from_a_second_process_and_finishes(thin):
    a, b, c = thin.hosts[:3]
    out = _deploy(thin, a, b, c, "--canary", "1", "--serial", "2", "--pause-after", "canary")
    assert {h: o["status"] for h, o in out.items()} == {a: "healthy", b: "pending", c: "pending"}, out
    rid = out[a]["rollout"]
    assert thin.run(b, CURRENT).returncode != 0                     # nothing past the canary changed
    record = _record(thin, rid)
    assert record["state"] == "paused" and record["batches"] == [[a], [b, c]] and record["next_batch"] == 1
    mine = [e for e in ledger(thin, a) if e["release"] == out[a]["release"]]
    assert mine and all(e["detail"].get("rollout") == rid for e in mine), mine

    r = fs(thin, "promote", rid, "--yes", "--json")                 # another process, as from another shell
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert {o["host"]: o["status"] for o in json_rows(r.stdout)} == {b: "healthy", c: "healthy"}
    record = _record(thin, rid)
    assert record["state"] == "done" and {h: x["status"] for h, x in record["hosts"].items()} == \
        {a: "healthy", b: "healthy", c: "healthy"}
    assert [e["what"] for e in record["events"]][:2] == ["paused after batch 1", "promoted from batch 2"]
    story = fs(thin, "rollouts", "show", rid, check_rc=0).stdout
    assert f"{a}: {out[a]['release']} healthy" in story and "timeline:" in story, story
    assert rid in fs(thin, "history", c, check_rc=0).stdout
    assert "only a paused deploy" in fs(thin, "promote", rid, "--yes", check_rc=2).stderr


def test_a_paused_rollout_aborted_puts_its_hosts_back_to_the_byte(thin):
    a, b, c = thin.hosts[:3]
    before = {h: _unit(thin, h) for h in (a, b)}
    out = _deploy(thin, a, b, c, "--serial", "1", "--pause-after", "each-batch")
    rid = out[a]["rollout"]
    r = fs(thin, "promote", rid[-4:], "--yes", "--json")             # its random end names it too
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert [o["status"] for o in json_rows(r.stdout)] == ["healthy", "pending"]
    assert _record(thin, rid)["state"] == "paused" and _unit(thin, b) != before[b]

    r = fs(thin, "abort", rid, "--yes", "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert {o["host"]: o["status"] for o in json_rows(r.stdout)} == {a: "rolled_back", b: "rolled_back"}
    for h in (a, b):
        assert thin.run(h, CURRENT).returncode != 0 and _unit(thin, h) == before[h], h
        assert any(e["name"] == "rollback" and e["state"] == "ok" and e["detail"].get("rollout") == rid
                   for e in ledger(thin, h)), h
    assert thin.run(c, CURRENT).returncode != 0                     # the batch after the pause never ran
    record = _record(thin, rid)
    assert record["state"] == "aborted" and record["hosts"][a]["status"] == "rolled_back"


def test_rollback_to_previous_walks_back_over_two_kept_releases(thin):
    host = thin.hosts[2]
    first = _deploy(thin, host)[host]["release"]
    second = _deploy(thin, host)[host]["release"]
    r = fs(thin, "rollback", host, "--to", "previous", "--json", check_rc=0)
    [row] = json_rows(r.stdout)
    assert (row["left"], row["target"]) == (second, first), row
    assert thin.run(host, CURRENT).stdout.decode().strip().endswith(first)
    [row] = json_rows(fs(thin, "rollback", host, "--to", "previous", "--json", check_rc=0).stdout)
    assert (row["left"], row["target"]) == (first, "baseline"), row
    assert "runs its baseline" in fs(thin, "rollback", host, "--to", "previous", check_rc=2).stderr

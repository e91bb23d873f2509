"""`deploy --prestage` on the lab pair (issue 17): the second host (ct200) is staged, and its smoke
runner started, while the canary (ct129) deploys; its own deploy then uses that release as it is
(0 bytes, no second build, the prestage's smoke verdict); a failed canary leaves the second host
with a staged, unswitched release and nothing live changed, which its next deploy marks failed. Every test leaves both hosts on their baselines."""

from __future__ import annotations

import pytest

from tests.lab.labtools import fs, json_rows, ledger

pytestmark = [pytest.mark.lab, pytest.mark.slow]

@pytest.fixture
def pair(lab_fleet):
    def reset():
        for host in lab_fleet.hosts[:2]:
            fs(lab_fleet, "lab", "fault", host, "--clear", check_rc=0)
            if lab_fleet.run(host, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode == 0:
                fs(lab_fleet, "rollback", host, check_rc=0)
    reset()
    yield lab_fleet
    reset()


def _lines(fleet, host, release):
    return [e for e in ledger(fleet, host) if e["release"] == release]


def test_the_later_host_is_staged_during_the_canary_and_its_deploy_sends_nothing(pair):
    canary, other = pair.hosts[:2]
    # Earlier tests' deploys left the patch set's objects on the host (a repeat stage sends 0 bytes):
    # without them only the prestage can have sent what the deploy then finds there.
    assert pair.run(other, "rm -rf /var/lib/fleetspec/objects").returncode == 0
    r = fs(pair, "deploy", canary, other, "--algo", "ddtree", "--canary", "1", "--prestage", "--no-gates",
           "--yes", "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = {o["host"]: o for o in json_rows(r.stdout)}
    assert {h: o["status"] for h, o in out.items()} == {canary: "healthy", other: "healthy"}
    rid = out[other]["release"]
    stages = [e for e in _lines(pair, other, rid) if e["name"] == "stage" and e["state"] == "ok"]
    assert len(stages) == 2, stages
    prestaged, own = stages
    assert prestaged["detail"]["prestage"] is True and prestaged["detail"]["sent_bytes"] > 0, prestaged
    assert own["detail"]["prestaged"] is True and own["detail"]["sent_bytes"] == 0, own
    # the prestage started the smoke runner too; the deploy kept it (passed, same input) and ran none
    assert prestaged["detail"]["smoke_started"] is True and own["detail"].get("smoke_kept") is True, own
    canary_probed = [e for e in ledger(pair, canary) if e["release"] == out[canary]["release"]
                     and e["name"] == "probes" and e["state"] == "ok"][0]
    assert prestaged["ts"] < canary_probed["ts"], "the prestage did not overlap the canary's deploy"
    assert [e["state"] for e in _lines(pair, other, rid) if e["kind"] == "status"] == \
        ["staged", "staged", "switched", "healthy"]
    smoke = [e for e in _lines(pair, other, rid) if e["name"] == "smoke" and e["state"] == "ok"]
    assert smoke and smoke[0]["detail"]["smoke"], smoke      # the smoke tests ran on the prestaged overlay


def test_a_failed_canary_leaves_a_staged_release_the_next_deploy_marks_failed(pair):
    canary, other = pair.hosts[:2]
    fs(pair, "lab", "fault", canary, "crash_at_start", "only_algorithm=DDTREE", check_rc=0)
    pid_before = pair.run(other, "systemctl show -p MainPID --value sglang-qwen").stdout
    r = fs(pair, "deploy", canary, other, "--algo", "ddtree", "--canary", "1", "--prestage", "--no-gates",
           "--yes", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = {o["host"]: o for o in json_rows(r.stdout)}
    assert out[canary]["status"] == "rolled_back" and out[other]["status"] == "skipped", out
    left = out[other]["release"]
    assert left and "stays staged" in out[other]["reason"], out[other]
    assert [e["state"] for e in _lines(pair, other, left) if e["kind"] == "status"] == ["staged"]
    assert pair.run(other, f"test -f /var/lib/fleetspec/sglang-qwen/releases/{left}/manifest.json").returncode == 0
    assert pair.run(other, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode != 0   # nothing switched
    assert pair.run(other, "systemctl show -p MainPID --value sglang-qwen").stdout == pid_before
    notes = json_rows(fs(pair, "status", other, "--json", check_rc=0).stdout)[0]["notes"]
    assert any(f"release {left} is prestaged, not switched" in n for n in notes), notes
    assert not any("died" in n for n in notes), notes      # waiting for a deploy is not a dead deploy
    again = fs(pair, "deploy", other, "--algo", "ddtree", "--no-gates", "--yes", "--json")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    new = json_rows(again.stdout)[0]["release"]
    assert new != left
    preflight = [e for e in _lines(pair, other, new) if e["name"] == "preflight" and e["state"] == "ok"][0]
    assert preflight["detail"]["abandoned"] == [left]
    assert [e["state"] for e in _lines(pair, other, left) if e["kind"] == "status"] == ["staged", "failed"]


def test_a_release_staged_ahead_is_what_the_next_deploy_switches_to(pair):
    """`deploy --stage-only` (issue 17): the release is staged and its smoke tests run while the
    host serves on, unchanged; the next deploy of that algo takes the release as it is: nothing
    sent, no build, the staged smoke verdict kept, so the maintenance window holds only the switch."""
    host = pair.hosts[1]
    if pair.run(host, "test -d /var/lib/fleetspec/sglang-qwen/baseline").returncode != 0:
        fs(pair, "baseline", host, "--retake", check_rc=0)        # what the rollback below goes back to
    unit_before = pair.run(host, "systemctl cat sglang-qwen").stdout
    pid_before = pair.run(host, "systemctl show -p MainPID --value sglang-qwen").stdout
    r = fs(pair, "deploy", host, "--algo", "ddtree", "--stage-only", "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    row = json_rows(r.stdout)[0]
    assert row["status"] == "staged" and row["exit_code"] == 0, row
    rid = row["release"]
    # nothing that runs changed: the unit with its drop-ins, the engine's process, no `current`
    assert pair.run(host, "systemctl cat sglang-qwen").stdout == unit_before
    assert pair.run(host, "systemctl show -p MainPID --value sglang-qwen").stdout == pid_before
    assert pair.run(host, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode != 0
    assert [e["state"] for e in _lines(pair, host, rid) if e["kind"] == "status"] == ["staged"]
    smoke = [e for e in _lines(pair, host, rid) if e["name"] == "smoke" and e["state"] == "ok"]
    assert len(smoke) == 1 and smoke[0]["detail"]["smoke"], smoke     # the verdict, read while staging
    notes = json_rows(fs(pair, "status", host, "--json", check_rc=0).stdout)[0]["notes"]
    assert any(f"release {rid} is staged ahead, not switched" in n and f"fleetspec deploy {host} --algo ddtree" in n
               for n in notes), notes
    # a rollback meanwhile (to the baseline) leaves it waiting: it is no deploy to finish
    back = json_rows(fs(pair, "rollback", host, "--json", check_rc=0).stdout)[0]
    assert back["status"] == "rolled_back" and rid not in back["finished_interrupted"], back
    assert [e["state"] for e in _lines(pair, host, rid) if e["kind"] == "status"] == ["staged"]
    planned = json_rows(fs(pair, "deploy", host, "--algo", "ddtree", "--plan", "--json", check_rc=0).stdout)[0]
    assert any(f"release {rid} was staged ahead" in n for n in planned["plan"]["notes"]), planned

    again = fs(pair, "deploy", host, "--algo", "ddtree", "--no-gates", "--yes", "--json")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    out = json_rows(again.stdout)[0]
    assert out["status"] == "healthy" and out["release"] == rid, out
    stages = [e for e in _lines(pair, host, rid) if e["name"] == "stage" and e["state"] == "ok"]
    assert len(stages) == 2, stages
    assert stages[1]["detail"]["prestaged"] is True and stages[1]["detail"]["sent_bytes"] == 0, stages[1]
    assert stages[1]["detail"].get("smoke_kept") is True, stages[1]    # no second runner
    assert [e["state"] for e in _lines(pair, host, rid) if e["kind"] == "status"] == \
        ["staged", "staged", "switched", "healthy"]
    preflight = [e for e in _lines(pair, host, rid) if e["name"] == "preflight" and e["state"] == "ok"][-1]
    assert preflight["detail"]["abandoned"] == [], preflight


def test_a_release_whose_smoke_tests_fail_while_staged_ahead_is_failed_and_nothing_changes(pair, tmp_path):
    """A staged-ahead release whose smoke tests fail is marked failed (exit 1, the failing import
    named), the host serving on untouched; the next deploy never takes it."""
    from tests.lab import reliability_lab as R

    host = pair.hosts[1]

    def failing(data):
        data["smoke"] = {"imports": ["sglang.srt.server_args", "fleetspec_lab_absent_module"]}

    root = R.make_root(tmp_path / "root", [host], playbooks={"ddtree.yaml": failing})
    unit_before = pair.run(host, "systemctl cat sglang-qwen").stdout
    pid_before = pair.run(host, "systemctl show -p MainPID --value sglang-qwen").stdout
    r = R.fs(root, "deploy", host, "--algo", "ddtree", "--stage-only", "--json")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    row = json_rows(r.stdout)[0]
    assert row["status"] == "failed" and row["failed_step"] == "smoke", row
    assert "fleetspec_lab_absent_module" in row["reason"] and "nothing live changed" in row["reason"], row
    rid = row["release"]
    assert pair.run(host, "systemctl cat sglang-qwen").stdout == unit_before
    assert pair.run(host, "systemctl show -p MainPID --value sglang-qwen").stdout == pid_before
    assert pair.run(host, "readlink /var/lib/fleetspec/sglang-qwen/current").returncode != 0
    story = [(e["state"], e["detail"].get("step")) for e in _lines(pair, host, rid) if e["kind"] == "status"]
    assert story == [("failed", "smoke")], story
    assert pair.run(host, f"test -e /var/lib/fleetspec/sglang-qwen/releases/{rid}/smoke/out").returncode == 0
    notes = json_rows(fs(pair, "status", host, "--json", check_rc=0).stdout)[0]["notes"]
    assert not any("staged ahead" in n or "died" in n for n in notes), notes
    planned = json_rows(fs(pair, "deploy", host, "--algo", "ddtree", "--plan", "--json", check_rc=0).stdout)[0]
    assert planned["status"] == "planned" and not any("staged ahead" in n for n in planned["plan"]["notes"]), planned

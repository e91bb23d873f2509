"""Deploy and rollback end to end on the lab's ct129 (real systemd 252, sshd, sglang 0.5.13.post1).

Every test starts from ct129 on its baseline (NEXTN, healthy, no faults) and checks, byte for byte,
that whatever happened the host ends on a recorded state: unit file bytes, `systemctl show -p
ExecStart`, the drop-in folder, sglang's files against pip's RECORD, and the ledger's story.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.lab import labtools, reliability_lab
from tests.lab.labtools import fs

pytestmark = [pytest.mark.lab, pytest.mark.slow]

HOST = "ct129"
SERVICE = "sglang-qwen.service"
UNIT = f"/etc/systemd/system/{SERVICE}"
STATE = "/var/lib/fleetspec/sglang-qwen"
CT129_EXECSTART_ARGV = (
    "/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3.6-27B --port 30000 "
    "--host 0.0.0.0 --tp-size 2 --mem-fraction-static 0.88 --context-length 131072 --max-running-requests 16 "
    "--mamba-full-memory-ratio 0.5 --mamba-scheduler-strategy extra_buffer --reasoning-parser qwen3 "
    "--tool-call-parser qwen3_coder --speculative-algo NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4"
)


def sh(fleet, script, timeout=60) -> str:
    return labtools.sh(fleet, HOST, script, timeout)


def snapshot(fleet) -> dict:
    """What must be byte-identical to the baseline after any failure or rollback."""
    out = sh(fleet, f"sha256sum {UNIT}; echo ---; systemctl show -p ExecStart --value {SERVICE}; echo ---; "
                    f"ls -A /etc/systemd/system/{SERVICE}.d 2>/dev/null; echo ---; readlink {STATE}/current || true")
    unit, execstart, dropins, current = out.split("---\n")
    return {"unit": unit.split()[0], "execstart_argv": execstart.split("argv[]=")[1].split(" ;")[0].strip(),
            "dropins": dropins.split(), "current": current.strip()}


def status(fleet) -> dict:
    return labtools.status_rows(fs(fleet, "status", HOST, "--json"))[-1]


def ledger(fleet) -> list[dict]:
    return labtools.ledger(fleet, HOST)


def release_story(fleet, release: str) -> list[str]:
    return [e["state"] for e in ledger(fleet) if e["release"] == release and e["kind"] == "status"]


def wait_healthy(fleet, deadline=180) -> dict:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        s = status(fleet)
        if s["health"] == "ok":
            return s
        time.sleep(2)
    raise AssertionError(f"{HOST} not healthy after {deadline}s: {s}")


@pytest.fixture
def ct129(lab_fleet):
    """ct129 on its baseline, healthy, no faults, no lock; the baseline snapshot."""
    fs(lab_fleet, "lab", "fault", HOST, "--clear", check_rc=0)
    if sh(lab_fleet, f"readlink {STATE}/current || true").strip():
        fs(lab_fleet, "rollback", HOST, check_rc=0)
    s = wait_healthy(lab_fleet)
    assert s["algo"] == "NEXTN" and s["served_algo"] == "EAGLE", s
    snap = snapshot(lab_fleet)
    assert snap["execstart_argv"] == CT129_EXECSTART_ARGV
    assert snap["dropins"] == [] and snap["current"] == ""
    yield snap
    fs(lab_fleet, "lab", "fault", HOST, "--clear")


def assert_on_baseline(fleet, snap):
    assert snapshot(fleet) == snap
    s = wait_healthy(fleet)
    assert s["algo"] == "NEXTN" and s["served_algo"] == "EAGLE" and s["drift"] == "pristine", s


def last_release(fleet) -> str:
    return [e for e in ledger(fleet) if e["kind"] == "status"][-1]["release"]


def test_plan_changes_nothing(lab_fleet, ct129):
    tree = "find /etc/systemd/system /var/lib/fleetspec -type f -print0 2>/dev/null | sort -z | xargs -0 sha256sum"
    before = sh(lab_fleet, tree)
    r = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--plan", check_rc=0)
    assert "--speculative-ddtree-shadow-linear" in r.stdout      # hybrid target: shadow-linear, said so
    assert "verify=auto -> shadow-linear" in r.stdout
    assert "sglang/srt/speculative/ddtree_utils.py" in r.stdout
    assert ("-- steps: preflight -> lock -> baseline -> stage (smoke tests start, detached) -> render -> measure -> "
            "smoke (their verdict) -> switch -> restart") in r.stdout
    assert sh(lab_fleet, tree) == before


def test_full_tree_verification_refused_on_hybrid_before_touching_host(lab_fleet, ct129):
    lines = len(ledger(lab_fleet)) if sh(lab_fleet, f"ls {STATE}/ledger.jsonl 2>/dev/null || true").strip() else 0
    r = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--set", "verify=tree", "--yes")
    assert r.returncode == 2, r.stderr
    assert "hybrid" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(lab_fleet) == ct129
    now = len(ledger(lab_fleet)) if sh(lab_fleet, f"ls {STATE}/ledger.jsonl 2>/dev/null || true").strip() else 0
    assert now == lines


def test_deploy_ddtree_then_rollback_is_byte_exact(lab_fleet, ct129):
    r = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--yes", check_rc=0)
    assert "healthy" in r.stdout
    s = status(lab_fleet)
    assert s["served_algo"] == "DDTREE" and s["algo"] == "DDTREE" and s["release_status"] == "healthy", s
    release = s["release"]
    assert release_story(lab_fleet, release)[-1] == "healthy"
    assert snapshot(lab_fleet)["dropins"] == ["zz-fleetspec.conf"]
    assert s["drift"] in ("pristine", "managed by fleetspec")   # the live venv was never edited
    fs(lab_fleet, "rollback", HOST, check_rc=0)
    assert_on_baseline(lab_fleet, ct129)
    h = fs(lab_fleet, "history", HOST, check_rc=0)
    assert release in h.stdout and "rollback" in h.stdout


def _stage_and_smoke(fleet, release: str) -> tuple[dict, dict]:
    """The stage and smoke steps' ledger details (the smoke's without its seconds, its paths with
    the release's folder named `<release>`)."""
    entries = [e for e in ledger(fleet) if e["release"] == release and e["kind"] == "step" and e["state"] == "ok"]
    smoke = {k: v for k, v in next(e["detail"] for e in entries if e["name"] == "smoke").items() if k != "seconds"}
    return (next(e["detail"] for e in entries if e["name"] == "stage"),
            json.loads(json.dumps(smoke).replace(f"/releases/{release}/", "/releases/<release>/")))


def test_a_restaged_release_replays_the_smoke_verdict_until_the_sglang_install_changes(lab_fleet, ct129):
    """Stage, stage the same again: the second stage replays the first one's passing verdict (real
    sglang 0.5.13.post1 in the host's venv; its runner never starts) and its smoke step reads the
    same result. A file touched in sglang's install (content unchanged, ctime new) makes the third
    run the tests again. `--stage-only` goes through the deploy's own stage and smoke steps with
    nothing live changed, so no engine restarts. (A stage before them warms the host: the first
    one after the lab's boot changes its overlay folders' xattrs.)"""
    def deploy() -> str:
        r = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--stage-only", "--yes", "--json", check_rc=0)
        return json.loads(r.stdout.strip().splitlines()[-1])["release"]

    deploy()    # after a boot, overlayfs's first lookups change the install's folders (README): not judged
    first = deploy()
    first_stage, first_smoke = _stage_and_smoke(lab_fleet, first)
    second = deploy()
    stage, smoke = _stage_and_smoke(lab_fleet, second)
    assert stage["smoke_reused"]["release"] == first_stage.get("smoke_reused", {}).get("release", first), stage
    assert smoke == first_smoke and smoke["smoke"]["parse_args"], smoke
    folder = f"{STATE}/releases/{second}/smoke"
    assert sh(lab_fleet, f"ls {folder}").split() == ["err", "in", "out", "rc", "reused", "started"]
    sh(lab_fleet, "touch /root/ml-env/lib/python3.11/site-packages/sglang/version.py")
    third = deploy()
    stage, smoke = _stage_and_smoke(lab_fleet, third)
    assert "smoke_reused" not in stage and smoke == first_smoke, stage
    assert "pid" in sh(lab_fleet, f"ls {STATE}/releases/{third}/smoke").split()     # a runner ran
    assert_on_baseline(lab_fleet, ct129)
    # The next deploy switches to the last staged release (the earlier ones are left unswitched),
    # and the host goes back: no staged release is left for the next test to switch to.
    r = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", "--json", check_rc=0)
    assert json.loads(r.stdout.strip().splitlines()[-1])["release"] == third
    fs(lab_fleet, "rollback", HOST, check_rc=0)
    assert_on_baseline(lab_fleet, ct129)


FAULTS = [
    pytest.param(["crash_at_start"], "probes", id="crash_at_start"),
    pytest.param(["hang_at_start"], "probes", id="hang_at_start"),
    pytest.param(["health_503_after=0"], "probes", id="health_503"),
    pytest.param(["wrong_algorithm=EAGLE"], "probes", id="wrong_algorithm"),
    pytest.param(["garbage_output"], "gates", id="garbage_output"),
]


@pytest.mark.parametrize("fault,failed_step", FAULTS)
def test_fault_in_new_release_reverts_to_nextn(lab_fleet, ct129, fault, failed_step):
    fs(lab_fleet, "lab", "fault", HOST, *fault, "only_algorithm=DDTREE", check_rc=0)
    # A hung start is found only at the host's ready_timeout: 30 s here (the lab's 120 s is for
    # loaded machines), which still leaves the baseline's ~10 s load three times its time.
    with ready_timeout(lab_fleet, 30 if fault == ["hang_at_start"] else None):
        r = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--yes", "--json")
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "rolled_back" and out["failed_step"] == failed_step, out
    if fault == ["crash_at_start"]:   # seen when the process exits, not after systemd's RestartSec=5 restart
        assert out["evidence"]["exit_status"] == 1 and "main process exited with status 1" in out["reason"], out
        n_before = next(e["detail"]["n_restarts_before"] for e in ledger(lab_fleet)
                        if e["release"] == out["release"] and e["name"] == "restart" and e["state"] == "ok")
        assert f"NRestarts={n_before}" in out["reason"], out
    assert_on_baseline(lab_fleet, ct129)
    story = release_story(lab_fleet, out["release"])
    assert story[-3:] == ["switched", "failed", "rolled_back"], story
    steps = [e["name"] for e in ledger(lab_fleet) if e["release"] == out["release"] and e["kind"] == "step"]
    assert steps[-1] == "revert"


def test_smoke_beside_the_load_passes_then_a_failing_one_reverts_to_nextn(lab_fleet, ct129, tmp_path):
    """smoke.when: beside-load: the switch does not wait for the verdict. One that passes is read
    after the restart and before the probes and the deploy lands; one that fails while the new
    engine loads fails the deploy after the switch: reverted, byte for byte."""
    from tests.lab import reliability_lab as R

    def beside_load(imports):
        def edit(data):
            data["smoke"] = {"imports": imports, "when": "beside-load"}
        return edit

    good = R.make_root(tmp_path / "good", [HOST], playbooks={"ddtree.yaml": beside_load(
        ["sglang.srt.speculative.ddtree_utils"])})
    r = R.fs(good, "deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", "--json")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "healthy", out
    steps = [(e["name"], e["state"]) for e in ledger(lab_fleet) if e["release"] == out["release"] and e["kind"] == "step"]
    assert (steps.index(("restart", "ok")) < steps.index(("smoke", "started")) < steps.index(("smoke", "ok"))
            < steps.index(("probes", "started")) < steps.index(("commit", "ok"))), steps
    s = status(lab_fleet)
    assert s["health"] == "ok" and s["served_algo"] == "DDTREE" and s["release"] == out["release"], s
    assert "ddtree_utils" in sh(lab_fleet, f"cat {STATE}/releases/{out['release']}/smoke/out"), "no verdict read"
    fs(lab_fleet, "rollback", HOST, check_rc=0)
    assert_on_baseline(lab_fleet, ct129)

    root = R.make_root(tmp_path / "root", [HOST], playbooks={"ddtree.yaml": beside_load(
        ["sglang.srt.speculative.ddtree_utils", "fleetspec_lab_absent_module"])})
    r = R.fs(root, "deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", "--json")
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "rolled_back" and out["failed_step"] == "smoke", out
    assert "fleetspec_lab_absent_module" in out["reason"], out
    assert_on_baseline(lab_fleet, ct129)
    assert release_story(lab_fleet, out["release"])[-3:] == ["switched", "failed", "rolled_back"]
    steps = [(e["name"], e["state"]) for e in ledger(lab_fleet) if e["release"] == out["release"] and e["kind"] == "step"]
    assert steps.index(("restart", "ok")) < steps.index(("smoke", "started")) < steps.index(("revert", "started")), steps


@contextlib.contextmanager
def ready_timeout(fleet, seconds: float | None):
    """ct129's extra.ready_timeout set to `seconds` in the lab inventory for the block."""
    if seconds is None:
        yield
        return
    before = fleet.inventory.read_bytes()
    data = yaml.safe_load(before)
    data["hosts"][HOST].setdefault("vars", {}).setdefault("extra", {})["ready_timeout"] = seconds
    fleet.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        yield
    finally:
        fleet.inventory.write_bytes(before)


def _start_paused_deploy(fleet, step):
    return reliability_lab.start_paused(fleet.root, HOST, step, "--algo", "ddtree")


def test_sigkill_after_switch_is_flagged_and_rollback_restores(lab_fleet, ct129):
    proc = _start_paused_deploy(lab_fleet, "restart")      # switch done, restart not yet
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    s = status(lab_fleet)
    assert any("interrupted" in n for n in s["notes"]), s
    again = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--yes")
    assert again.returncode == 3 and f"fleetspec rollback {HOST}" in again.stderr, again.stderr
    fs(lab_fleet, "rollback", HOST, check_rc=0)
    assert_on_baseline(lab_fleet, ct129)
    assert "rolled_back" in [e["state"] for e in ledger(lab_fleet) if e["kind"] == "status"][-1:]


def test_second_deploy_refused_naming_holder_and_stale_lock_recovers(lab_fleet, ct129):
    proc = _start_paused_deploy(lab_fleet, "stage")        # holds the lock, stopped
    try:
        r = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--yes")
        assert r.returncode == 2 and f"pid {proc.pid}" in r.stderr, r.stderr
        u = fs(lab_fleet, "unlock", HOST, "--force")
        assert u.returncode == 2 and "still running" in u.stderr, u.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    fs(lab_fleet, "unlock", HOST, "--force", check_rc=0)      # the dead holder is ended
    assert snapshot(lab_fleet) == ct129                        # died before switch: nothing changed


def test_rollback_sh_by_hand_restores_nextn(lab_fleet, ct129):
    fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)
    out = sh(lab_fleet, f"sh {STATE}/current/rollback.sh", timeout=120)
    assert "back on baseline" in out
    assert_on_baseline(lab_fleet, ct129)


@pytest.fixture
def guarded_root(lab_fleet, tmp_path):
    """A fleet root whose ddtree playbook opts into the crash-loop guard."""
    import shutil

    root = tmp_path / "fleet"
    for folder in ("playbooks", "templates"):
        shutil.copytree(lab_fleet.root / folder, root / folder, symlinks=True)
    (root / "inventory").mkdir()
    text = (lab_fleet.root / "inventory" / "lab.yaml").read_text()
    (root / "inventory" / "lab.yaml").write_text(text.replace("../.lab/", f"{lab_fleet.root}/.lab/"))
    playbook = root / "playbooks" / "ddtree.yaml"
    playbook.write_text(playbook.read_text() + "guard: {burst: 2, interval_s: 300}\n")
    return root


def test_crash_loop_guard_reverts_without_fleetspec(lab_fleet, ct129, guarded_root):
    r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(guarded_root), "deploy", HOST, "--algo",
                        "ddtree", "--yes", "--no-gates", "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    release = json.loads(r.stdout.strip().splitlines()[-1])["release"]
    dropin = sh(lab_fleet, f"cat /etc/systemd/system/{SERVICE}.d/zz-fleetspec.conf")
    assert "OnFailure=fleetspec-guard@sglang-qwen.service" in dropin
    # fleetspec has left; the release starts crash-looping (a bad driver, a bad node...)
    fs(lab_fleet, "lab", "fault", HOST, "crash_at_start", "only_algorithm=DDTREE", check_rc=0)
    sh(lab_fleet, f"systemctl restart --no-block {SERVICE}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if any(e["by"] == "rollback.sh" and e["release"] == release and e["state"] == "rolled_back"
               for e in ledger(lab_fleet)):
            break
        time.sleep(3)
    else:
        raise AssertionError("the guard never ran: " + sh(lab_fleet, f"systemctl status {SERVICE} fleetspec-guard@sglang-qwen --no-pager; true"))
    assert_on_baseline(lab_fleet, ct129)
    reasons = {e["detail"].get("reason") for e in ledger(lab_fleet) if e["by"] == "rollback.sh" and e["release"] == release}
    assert reasons == {"crash-loop"}


def test_in_place_mode_backs_up_replaces_and_restores_pristine(lab_fleet, ct129):
    r = fs(lab_fleet, "deploy", HOST, "--algo", "ddtree", "--mode", "in-place", "--yes", "--no-gates", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    release = json.loads(r.stdout.strip().splitlines()[-1])["release"]
    s = status(lab_fleet)
    assert s["served_algo"] == "DDTREE"
    assert "sglang/srt/speculative/spec_info.py" in s["drift_files"]          # the live venv was edited
    backup = sh(lab_fleet, f"cd {STATE}/releases/{release}/backup && find . -type f | sort")
    assert "./sglang/srt/speculative/spec_info.py" in backup
    assert "PYTHONPATH" not in sh(lab_fleet, f"cat /etc/systemd/system/{SERVICE}.d/zz-fleetspec.conf")
    fs(lab_fleet, "rollback", HOST, check_rc=0)
    assert_on_baseline(lab_fleet, ct129)                                      # drift pristine again

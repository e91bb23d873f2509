"""Real ledgers without a lab: the deploy's own step machinery (ops.deploy.Deploy.step/_mark)
records each line over a real SSH connection (HostState.record: the remote append and the local
mirror), with the figures the real gates compute (ops.gates.judge on measurements).

Only what a lab deploy would add is missing: the service itself. The step bodies return the
detail the real steps return (their keys are copied from ops/deploy.py); the state folder is
under the test's tmp folder instead of /var/lib/fleetspec.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

from fleetspec.model import ledger as L
from fleetspec.model.layout import HostLayout
from fleetspec.model.playbook import load_playbook_for
from fleetspec.model.release import BASELINE, new_release_id
from fleetspec.ops import gates
from fleetspec.ops.deploy import Deploy, StepFailed
from fleetspec.ops.hoststate import HostState

REPO = Path(__file__).resolve().parents[2]
ARGV = ["/root/ml-env/bin/python3", "-m", "sglang.launch_server", "--model-path", "/root/models/Qwen3.6-27B",
        "--port", "30000", "--tp-size", "2", "--mamba-scheduler-strategy", "extra_buffer",
        "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/root/models/Qwen3.6-27B-DFlash",
        "--speculative-ddtree-budget", "64", "--speculative-ddtree-topk-cap", "8",
        "--speculative-ddtree-shadow-linear"]
UNIT_SHA = hashlib.sha256(b"[Unit]\nDescription=SGLang Qwen3.6-27B\n").hexdigest()


def _measure(accepts, tok_s, outputs) -> gates.Measurement:
    return gates.Measurement(outputs=outputs, accept_lengths=list(accepts), tokens_per_s=dict(tok_s))


def _deployer(t, host, state_root: PurePosixPath, mirror: Path, algo: str, when: float) -> Deploy:
    d = Deploy.__new__(Deploy)
    d.t, d.host, d.service = t, host, host.vars.service
    d.req = SimpleNamespace(pause_at=None)
    d.echo = d.progress = lambda line: None
    d.state = HostState(t, host.name, d.service, mirror=mirror)
    d.state.layout = HostLayout(d.service, root=state_root)
    d.release_id = new_release_id(algo, now=when)
    d.step_seconds = {}
    return d


def record_story(t, host, state_root: PurePosixPath, mirror: Path) -> dict[str, str]:
    """Four releases: healthy; gates failed and rolled back; probes failed (engine crashed) and
    rolled back; stage failed before the switch. Returns {kind: release id}."""
    playbook = load_playbook_for(REPO, "ddtree")
    prompts = list(gates.GOLDEN_PROMPTS)[:4]
    base_out = {p: [11, 12, 13, 14, 15, 16] for p in prompts}
    before = _measure([2.9, 3.1, 3.0], {1: 41.52, 4: 150.3}, base_out)
    ids = {}

    def front(d):
        d.step("preflight", lambda: {"sglang": "0.5.23", "torch": "2.13.0+cpu", "hybrid": True,
                                     "options": {"budget": 64, "topk_cap": 8, "verify": "shadow-linear"},
                                     "notes": ["hybrid target: verify=auto became shadow-linear"],
                                     "patchset": "ddtree/patchsets/sglang-0.5.23", "argv": ARGV, "abandoned": []})
        d.step("baseline", lambda: {"unit_sha256": UNIT_SHA, "previous": BASELINE})

    # 1. healthy
    d = _deployer(t, host, state_root, mirror, "ddtree", 1_764_560_700)
    ids["healthy"] = d.release_id
    front(d)
    d.step("stage", lambda: {"files": 7, "kernels": 1, "sent_bytes": 182_331})
    d._mark(L.STAGED)
    d.step("smoke", lambda: {"imports": ["sglang.srt.speculative.ddtree_utils"], "parse_args": "ok",
                             "kernels": "tree_mask loaded", "ddtree_sample": {"nodes": 64, "depth": 7}})
    d.step("render", lambda: {"dropin_sha256": "930fa1e7b3c1d2e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2a1ed6034cf35",
                              "lint": "systemd-analyze verify: ok"})
    d.step("measure", lambda: {"figures": before.figures()})
    d._mark(L.SWITCHED, previous=BASELINE)
    d.step("switch", lambda: {})
    d.step("restart", lambda: {"n_restarts_before": 0})
    d.step("probes", lambda: {"waited_s": 14.72, "served": "DDTREE", "accept_length": 3.42})
    after = _measure([3.4, 3.5, 3.3], {1: 44.1, 4: 149.9}, base_out)
    verdicts = gates.judge(playbook.gates, before, after, hybrid=True)
    figures = {v.name: v.figures for v in verdicts}
    assert not [v for v in verdicts if v.blocks], verdicts
    d.step("gates", lambda: {"figures": figures})
    d._mark(L.HEALTHY)
    d.step("commit", lambda: {"pruned": []})

    # 2. gates failed after the switch: reverted
    d = _deployer(t, host, state_root, mirror, "ddtree", 1_764_561_000)
    ids["gates"] = d.release_id
    front(d)
    d.step("stage", lambda: {"files": 7, "kernels": 1, "sent_bytes": 0})
    d._mark(L.STAGED)
    d.step("measure", lambda: {"figures": before.figures()})
    d._mark(L.SWITCHED, previous=ids["healthy"])
    d.step("switch", lambda: {})
    d.step("restart", lambda: {"n_restarts_before": 1})
    d.step("probes", lambda: {"waited_s": 15.03, "served": "DDTREE", "accept_length": 1.21})
    slow = _measure([1.2, 1.25, 1.18], {1: 17.4, 4: 60.02}, {p: [11, 12, 13, 99, 98, 97] for p in prompts})
    verdicts = gates.judge(playbook.gates, before, slow, hybrid=False)
    blocking = [v for v in verdicts if v.blocks]
    figures = {v.name: v.figures for v in verdicts}

    def failing_gates():
        raise StepFailed("gates", "; ".join(f"{v.name} {v.verdict}: {v.reason}" for v in blocking), {"figures": figures})
    try:
        d.step("gates", failing_gates)
    except StepFailed as failure:
        _reverted(d, failure, ids["healthy"])

    # 3. the engine crashed at start: probes failed, reverted
    d = _deployer(t, host, state_root, mirror, "ddtree", 1_764_561_300)
    ids["probes"] = d.release_id
    front(d)
    d._mark(L.STAGED)
    d._mark(L.SWITCHED, previous=ids["healthy"])
    d.step("switch", lambda: {})
    d.step("restart", lambda: {"n_restarts_before": 2})
    journal = ["Dec 01 04:15:02 ct203 python3[2211]: fleetspec-lab-engine: fault crash_at_start: exiting",
               "Dec 01 04:15:02 ct203 systemd[1]: sglang-qwen.service: Main process exited, code=exited, status=1/FAILURE",
               "Dec 01 04:15:02 ct203 systemd[1]: sglang-qwen.service: Failed with result 'exit-code'."]

    def crashed():
        raise StepFailed("probes", "unit: sglang-qwen.service is activating/auto-restart (restarted 3 times)",
                         {"n_restarts": 3, "journal": journal})
    try:
        d.step("probes", crashed)
    except StepFailed as failure:
        _reverted(d, failure, ids["healthy"])

    # 4. refused before the switch: nothing on the service changed
    d = _deployer(t, host, state_root, mirror, "nextn", 1_764_561_600)
    ids["stage"] = d.release_id
    front(d)

    def no_space():
        raise StepFailed("stage", "cannot write /var/lib/fleetspec/objects/4b1d: No space left on device")
    try:
        d.step("stage", no_space)
    except StepFailed as failure:
        d._mark(L.FAILED, step=failure.step, reason=failure.reason)
    return ids


def _reverted(d: Deploy, failure: StepFailed, previous: str) -> None:
    """The ledger lines Deploy._revert writes when the revert succeeds."""
    d._mark(L.FAILED, step=failure.step, reason=failure.reason)
    d.state.record(L.Entry.step(d.release_id, "revert", "started", to=previous))
    d.state.record(L.Entry.step(d.release_id, "revert", "ok"))
    d._mark(L.ROLLED_BACK, to=previous)


def main(out: Path) -> None:
    """Write a fresh story to `out` (tests/fixtures/ledger/): a loopback sshd of our own, stopped after."""
    import json
    import tempfile

    from fleetspec.model.inventory import load_inventory
    from fleetspec.remote.transport import TransportPool
    from tests.conftest import Sshd, free_port, keygen, write_inventory

    work = Path(tempfile.mkdtemp(prefix="fleetspec-ledgers-"))
    key = keygen(work / "id_ed25519")
    server = Sshd(work / "sshd", free_port(), key).start()
    try:
        inv = write_inventory(work / "inv.yaml", {"ct203": server}, key)
        host = load_inventory(inv).hosts["ct203"]
        with TransportPool() as pool:
            ids = record_story(pool.get(host), host, PurePosixPath(str(work / "state")), work / "mirror")
        out.mkdir(parents=True, exist_ok=True)
        (out / "story.jsonl").write_text((work / "mirror" / "ledger.jsonl").read_text())
        (out / "story-ids.json").write_text(json.dumps(ids, indent=1, sort_keys=True) + "\n")
    finally:
        server.stop()


if __name__ == "__main__":
    import sys

    main(Path(sys.argv[1]))

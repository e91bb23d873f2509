"""Broken DDTree patch sets deployed to a lab tree host are reverted by the gates (exit 1); the
correct one passes and accepts more than the DFlash baseline it replaces.

The tree host is `ct150`-shaped (sglang 0.5.13.post1, pure attention, TP=1, DFlash; see
fleetspec/lab/profiles.py): the only shape where the real DDTree worker verifies a tree, so the
only one where broken tree code can decide anything. Each case deploys from a copy of the fleet
root whose ddtree playbook blocks only on the acceptance and parity gates (throughput is proven
elsewhere and costs ~20 s a measurement; here it is a two-request dry run) and whose 0.5.13.post1 patch set carries one mutation of
ddtree_utils.py (tests/ddtree_mutations.py). The greedy mutants deploy with the smoke tests cut
to imports, so that what rejects them is the gates, not the offline ddtree_sample check; the
biased sampling walk is never run by the worker (it verifies linearly for non-greedy requests) so
no gate can see it, and the smoke test's distribution check is what rejects it (exit 1 before the
switch). The unit tests in tests/unit/test_lab_engine_decode.py carry the detailed proof.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from fleetspec.lab import profiles
from tests.ddtree_mutations import mutate
from tests.lab import labtools

pytestmark = [pytest.mark.lab, pytest.mark.slow]

TREE_HOST = os.environ.get("FLEETSPEC_LAB_TREE_HOST", "ct150")
PAYLOAD_UTILS = "playbooks/ddtree/payload/ddtree_utils.py"
# Throughput stays, as a small dry run: the lab inventory's per-host override names it.
GATES = ("gates:\n  acceptance: {min: 2.0, vs_baseline_tolerance: 0.25, dry_run: false}\n"
         "  throughput: {min_ratio: 0.5, concurrency: [1], requests: 2, dry_run: true}\n"
         "  parity: {max_new_tokens: 32, hybrid_tolerance_tokens: 0, dry_run: false}\n")
FAST_SMOKE = "smoke: {imports: [sglang.srt.speculative.ddtree_utils]}\n"


@pytest.fixture(scope="module")
def tree_host(lab_fleet):
    """The tree host, up beside the session's pair (lab.up keeps running hosts)."""
    from fleetspec.lab import lab

    result = lab.up(lab_fleet.root, [TREE_HOST], log=lambda m: None)
    lab_fleet.addresses[TREE_HOST] = result.addresses[TREE_HOST]
    deadline = time.monotonic() + 180        # a fresh host's stand-in takes ~15-30 s to be ready
    while lab_fleet.run(TREE_HOST, "curl -sf -m 5 127.0.0.1:30000/ready").returncode != 0:
        assert time.monotonic() < deadline, f"{TREE_HOST}'s service never became ready"
        time.sleep(2)
    return TREE_HOST


def fleet_root(lab_fleet, tmp, *, mutation: str | None, smoke: str | None) -> str:
    root = tmp / (mutation or "correct")
    for folder in ("playbooks", "templates"):
        shutil.copytree(lab_fleet.root / folder, root / folder, symlinks=True)
    (root / "inventory").mkdir()
    text = (lab_fleet.root / "inventory" / "lab.yaml").read_text()
    (root / "inventory" / "lab.yaml").write_text(text.replace("../.lab/", f"{lab_fleet.root}/.lab/"))
    playbook = root / "playbooks" / "ddtree.yaml"
    lines = playbook.read_text().split("\ngates:\n")[0] + "\n" + GATES
    if smoke is not None:
        lines = "\n".join(l for l in lines.splitlines() if not l.startswith("smoke:")
                          and not l.startswith("  imports:") and not l.startswith("  parse_args:")
                          and not l.startswith("  kernels:") and not l.startswith("  ddtree_sample:")) + "\n" + smoke
    playbook.write_text(lines)
    if mutation:
        target = root / PAYLOAD_UTILS       # the patch set is generated from it again at deploy
        data = mutate(target.read_text(), mutation).encode()
        target.unlink()                     # a copy, never the checkout's file
        target.write_bytes(data)
    return str(root)


def deploy(root: str, host: str, *args) -> tuple[int, dict, float]:
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", root, "deploy", host, "--algo", "ddtree",
                        "--yes", "--json", *args], capture_output=True, text=True, timeout=900)
    rows = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert rows, r.stdout[-2000:] + r.stderr[-2000:]
    return r.returncode, json.loads(rows[-1]), time.monotonic() - started


def server_info(fleet, host) -> dict:
    return json.loads(labtools.sh(fleet, host, "curl -s 127.0.0.1:30000/server_info"))


@pytest.mark.parametrize("mutation,failed_step,gate", [
    ("greedy_one_too_many", "gates", "parity"),
    ("mask_sees_sibling", "gates", "parity"),
    ("drops_best_child", "gates", "acceptance"),   # output stays right (the walk only takes the
                                                   # target's tokens); acceptance collapses
    ("sampling_biased", "smoke", None),            # no gate runs verify_sampling: the smoke test's
                                                   # chi-square rejects it before the switch
])
def test_broken_patchset_is_rejected_and_host_stays_on_dflash(lab_fleet, tree_host, tmp_path, mutation,
                                                              failed_step, gate):
    smoke = FAST_SMOKE if failed_step == "gates" else None
    root = fleet_root(lab_fleet, tmp_path, mutation=mutation, smoke=smoke)
    rc, out, seconds = deploy(root, tree_host)
    print(f"\n{mutation}: exit {rc}, failed at {out.get('failed_step')}, {seconds:.1f} s")
    assert rc == 1 and out["failed_step"] == failed_step, out
    assert out["status"] in (("rolled_back",) if failed_step == "gates" else ("failed", "rolled_back")), out
    if gate:
        assert f"{gate} fail" in out["reason"], out["reason"]
    else:
        assert "sampling_distribution" in out["reason"], out["reason"]
    info = server_info(lab_fleet, tree_host)
    assert info["speculative_algorithm"] == "DFLASH", info.get("speculative_algorithm")


def test_correct_patchset_verifies_a_tree_and_accepts_more_than_dflash(lab_fleet, tree_host, tmp_path):
    root = fleet_root(lab_fleet, tmp_path, mutation=None, smoke=None)
    rc, out, seconds = deploy(root, tree_host)
    print(f"\ncorrect: exit {rc}, {seconds:.1f} s, figures {out.get('figures')}")
    assert rc == 0 and out["status"] == "healthy", out
    acceptance = out["figures"]["acceptance"]
    assert acceptance["accept_length"] > acceptance["baseline_accept_length"] * 1.2, acceptance
    assert out["figures"]["parity"]["prompts_compared"] == 8
    info = server_info(lab_fleet, tree_host)["lab_engine"]
    assert info["verify_mode"] == "tree" and info["worker"].endswith("ddtree_worker.DDTreeWorker"), info
    assert info["trees_built"] > 0 and info["steps_by_mode"].get("tree", 0) > 0, info
    labtools.fs(lab_fleet, "rollback", tree_host, check_rc=0)


def golden_accepts(fleet, host) -> list:
    from fleetspec.ops.gates import GOLDEN_PROMPTS

    out = []
    for prompt in GOLDEN_PROMPTS:
        body = json.dumps({"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 32}})
        data = json.loads(labtools.sh(fleet, host, f"curl -s -m 120 127.0.0.1:30000/generate -d {shlex.quote(body)}"))
        out.append((data["output_ids"], data["meta_info"]["spec_accept_length"]))
    return out


def test_ddtree_on_ct129_verifies_linearly_and_accepts_exactly_what_dflash_does(lab_fleet):
    """ct129's shape (hybrid, TP=2): the deploy asks for shadow-linear and the real worker builds no
    tree at TP=2, so DDTREE is DFlash's linear chain: same output, same acceptance, per prompt."""
    host = lab_fleet.hosts[0]
    assert profiles.for_host(host).like == "ct129"
    labtools.fs(lab_fleet, "deploy", host, "--algo", "dflash", "--yes", "--no-gates", check_rc=0)
    dflash = golden_accepts(lab_fleet, host)
    labtools.fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)
    ddtree = golden_accepts(lab_fleet, host)
    info = server_info(lab_fleet, host)
    labtools.fs(lab_fleet, "rollback", host, check_rc=0)
    assert info["speculative_algorithm"] == "DDTREE" and "--speculative-ddtree-shadow-linear" in info["launch_command"]
    engine = info["lab_engine"]
    assert (engine["verify_mode"], engine["builds_trees"]) == ("linear", False) and "tp > 1" in engine["linear_reason"]
    assert engine["worker"].endswith("ddtree_worker.DDTreeWorker")
    assert ddtree == dflash

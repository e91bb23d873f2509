"""`fleetspec gate` by URL against a lab engine, as a Kubernetes Job between partition steps would
run it: ct129's baseline (NEXTN) is measured from the controller at the host's address and
recorded, the host is moved to DDTree (the stand-in runs the release's real worker), and the gate
passes it; then the release's greedy output is broken (the lab's `garbage_output` fault, scoped
to DDTREE so the baseline it is judged against stays good) and the same gate fails it with exit 1.

On ct129's shape (hybrid, TP=2) DDTree verifies linearly, so a tree mutation (tests/ddtree_mutations.py)
changes nothing there; the fault breaks what the gates read: the tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from fleetspec.lab import profiles
from tests.lab import labtools

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# The playbook's acceptance and parity gates as they ship; throughput a small dry run (the lab
# shares this machine's cores, and its ratio is proven elsewhere).
GATES = ("gates:\n  acceptance: {min: 2.0, vs_baseline_tolerance: 0.25, dry_run: false}\n"
         "  throughput: {min_ratio: 0.5, concurrency: [1], requests: 4, dry_run: true}\n"
         "  parity: {max_new_tokens: 32, hybrid_tolerance_tokens: 0, dry_run: false}\n")


def gate(fleet, *args) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(fleet.root), "gate", "--quiet", *args],
                       capture_output=True, text=True, timeout=900)
    assert r.stdout.startswith("{"), r.stdout[-2000:] + r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_gate_passes_a_good_ddtree_release_and_fails_a_broken_one_against_ct129s_baseline(lab_fleet, tmp_path):
    host = lab_fleet.hosts[0]
    assert profiles.for_host(host).like == "ct129"
    url = f"http://{lab_fleet.addresses[host]}:30000"
    deadline = time.monotonic() + 300          # a fresh host's stand-in takes a while to load
    while not ready(url):
        assert time.monotonic() < deadline, f"{host}'s engine never answered {url}/ready"
        time.sleep(2)
    playbook = tmp_path / "playbooks" / "ddtree.yaml"
    playbook.parent.mkdir()
    (playbook.parent / "ddtree").symlink_to(lab_fleet.root / "playbooks" / "ddtree")
    playbook.write_text((lab_fleet.root / "playbooks" / "ddtree.yaml").read_text().split("\ngates:\n")[0]
                        + "\n" + GATES)
    base = tmp_path / "baseline.json"
    rc, out = gate(lab_fleet, "--baseline", url, "--record", str(base), "--playbook", str(playbook))
    assert rc == 0 and out["figures"]["requests_failed"] == 0 and out["figures"]["accept_length"] > 1, out

    labtools.fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)
    try:
        rc, good = gate(lab_fleet, "--baseline", str(base), "--candidate", url, "--playbook", str(playbook),
                        "--hybrid")
        labtools.fs(lab_fleet, "lab", "fault", host, "garbage_output", "only_algorithm=DDTREE", check_rc=0)
        rc_bad, bad = gate(lab_fleet, "--baseline", str(base), "--candidate", url, "--playbook", str(playbook),
                           "--hybrid")
    finally:
        labtools.fs(lab_fleet, "lab", "fault", host, "--clear")
        labtools.fs(lab_fleet, "rollback", host, check_rc=0)
    print(f"\ngood: exit {rc}, {good['gates']}\nbroken: exit {rc_bad}, {bad['reasons']}")
    assert rc == 0 and good["verdict"] == "pass", good
    assert good["candidate"]["speculative_algorithm"] == "DDTREE"
    verdicts = {g["name"]: g for g in good["gates"]}
    assert verdicts["parity"]["figures"]["prompts_compared"] == 8 and verdicts["acceptance"]["verdict"] == "pass"
    assert rc_bad == 1 and bad["verdict"] == "fail", bad
    assert {g["name"]: g["verdict"] for g in bad["gates"]}["parity"] == "fail", bad

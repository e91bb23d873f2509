"""The DDTree kernel inside a release, end to end on a lab host (sglang 0.5.23, real systemd):
the deployed payload loads the release's compiled library by itself and the ledger's smoke step
says `kernel:cpu`; a library that does not provide the op makes an optional kernel fall back
(deploy healthy, a note, `torch:cpu` in the ledger) and a required one fail at smoke with the
host unchanged."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetspec.ops.hoststate import DROPIN_NAME
from tests.lab import labtools

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SERVICE = "sglang-qwen.service"
DROPIN_DIR = f"/etc/systemd/system/{SERVICE}.d"
STATE = "/var/lib/fleetspec/sglang-qwen"


def _host(lab_fleet) -> str:
    return lab_fleet.hosts[1]           # the 0.5.23 host (plugin patch set, no hybrid guard)


def _root(lab_fleet, tmp_path: Path, *, required: bool, broken: bool) -> Path:
    """A copy of the fleet root; `broken` ships, as the kernel's build, a loadable library that
    registers no op (what a stale or foreign .so does), `required` flips the kernel_policy."""
    from fleetspec.build.kernel import build_kernel
    from fleetspec.model.kernel import KERNEL_JSON

    root = tmp_path / "fleet"
    for folder in ("playbooks", "templates"):
        shutil.copytree(lab_fleet.root / folder, root / folder, symlinks=True)
    (root / "inventory").mkdir()
    text = (lab_fleet.root / "inventory" / "lab.yaml").read_text()
    (root / "inventory" / "lab.yaml").write_text(text.replace("../.lab/", f"{lab_fleet.root}/.lab/"))
    playbook = root / "playbooks" / "ddtree.yaml"
    if required:
        playbook.write_text(playbook.read_text().replace("kernel_policy: optional", "kernel_policy: required"))
    if broken:
        kernel, _ = build_kernel(lab_fleet.root / "playbooks/ddtree/kernels/tree_mask")
        folder = root / "playbooks/ddtree/kernels/tree_mask"
        shutil.rmtree(folder)
        shutil.copytree(kernel.spec.root, folder)
        stranger = next(p for p in (Path("/lib/x86_64-linux-gnu/libm.so.6"), Path("/usr/lib/x86_64-linux-gnu/libm.so.6"))
                        if p.exists())
        shutil.copyfile(stranger, folder / kernel.library_file)
        data = json.loads((folder / KERNEL_JSON).read_text())
        data["build"]["sha256"] = hashlib.sha256((folder / kernel.library_file).read_bytes()).hexdigest()
        (folder / KERNEL_JSON).write_text(json.dumps(data))
    return root


def _deploy(root: Path, host: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(root), "deploy", host, "--algo", "ddtree",
                           "--yes", "--no-gates", "--json"], capture_output=True, text=True, timeout=900)


def _smoke_entry(lab_fleet, host: str, release: str) -> dict:
    steps = [e for e in labtools.ledger(lab_fleet, host) if e["release"] == release and e["kind"] == "step"
             and e["name"] == "smoke" and e["state"] in ("ok", "failed")]
    return steps[-1]


def _rollback(lab_fleet, host: str) -> None:
    labtools.fs(lab_fleet, "rollback", host, "--to", "baseline", check_rc=0)


def _release_of(r: subprocess.CompletedProcess) -> str:
    return json.loads(r.stdout.strip().splitlines()[-1])["release"]


def test_the_release_runs_the_compiled_kernel_and_the_ledger_says_so(lab_fleet):
    host = _host(lab_fleet)
    r = labtools.fs(lab_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", "--json")
    try:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        release = _release_of(r)
        smoke = _smoke_entry(lab_fleet, host, release)["detail"]
        assert smoke["candidates"] == "kernel:cpu" and "kernel_note" not in smoke
        assert json.loads(r.stdout.strip().splitlines()[-1])["kernel"] == {"candidates": "kernel:cpu"}
        assert smoke["smoke"]["kernel:tree_mask.so"]["checks"] == {"tree_mask": True, "topk_logprobs": True,
                                                                  "same_tree": True}
        assert smoke["smoke"]["ddtree_sample"]["kernel"]["library"].endswith(f"/releases/{release}/kernels/tree_mask.so")
        dropin = labtools.sh(lab_fleet, host, f"cat {DROPIN_DIR}/{DROPIN_NAME}")
        assert f"FLEETSPEC_KERNELS={STATE}/current/kernels" in dropin
        # The engine says which path it runs: its log (the journal) and, on the lab's stand-in,
        # /server_info (real sglang has no field for it: DEVELOPING.md).
        said = f"fleetspec_ddtree: kernel:cpu from {STATE}/current/kernels/tree_mask.so"
        journal = labtools.sh(lab_fleet, host, f"journalctl -o cat --no-pager _SYSTEMD_INVOCATION_ID="
                                               f"$(systemctl show -p InvocationID --value {SERVICE}) | grep fleetspec_ddtree: || true")
        assert said in journal.splitlines(), journal[-2000:]
        info = json.loads(labtools.sh(lab_fleet, host, "curl -sf http://127.0.0.1:30000/server_info"))
        assert info["ddtree_kernel"]["loaded"] and info["ddtree_kernel"]["line"] == said, info.get("ddtree_kernel")
    finally:
        _rollback(lab_fleet, host)


def test_a_library_without_the_op_falls_back_when_optional_and_fails_smoke_when_required(lab_fleet, tmp_path):
    host = _host(lab_fleet)
    optional = _root(lab_fleet, tmp_path / "optional", required=False, broken=True)
    r = _deploy(optional, host)
    try:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        smoke = _smoke_entry(lab_fleet, host, _release_of(r))["detail"]
        assert smoke["candidates"] == "torch:cpu"
        assert "torch fallback" in smoke["kernel_note"] and "does not register" in smoke["kernel_note"]
        outcome = json.loads(r.stdout.strip().splitlines()[-1])
        assert outcome["kernel"]["candidates"] == "torch:cpu" and "did not load" in outcome["kernel"]["kernel_note"]
    finally:
        _rollback(lab_fleet, host)
    before = labtools.sh(lab_fleet, host, f"ls -A {DROPIN_DIR} 2>/dev/null; readlink {STATE}/current || true")
    required = _root(lab_fleet, tmp_path / "required", required=True, broken=True)
    r = _deploy(required, host)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    failed = _smoke_entry(lab_fleet, host, _release_of(r))
    assert failed["state"] == "failed" and "tree_mask.so" in failed["detail"]["reason"]
    assert labtools.sh(lab_fleet, host, f"ls -A {DROPIN_DIR} 2>/dev/null; readlink {STATE}/current || true") == before
    assert labtools.sh(lab_fleet, host, f"systemctl is-active {SERVICE}").strip() == "active"

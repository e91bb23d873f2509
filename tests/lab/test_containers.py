"""Hosts whose engine runs in a container (docs/guide/containers.md): a unit whose ExecStart is
`podman run …` (the lab's pd hosts) and a service Podman's Quadlet generates from a `.container`
file (the pq hosts). The engine really runs in a container inside the nspawn host and fleetspec's
status reads it; a deploy runs end to end on both (smoke tests in the image, the drop-in's ExecStart
through the release's mount and label, restart, probes, gates), status and history show the
container, and `fleetspec rollback` and rollback.sh bring back the exact unit (or Quadlet file)
bytes and image; a release that crashes at start reverts.

One pd and one pq host for the module (FLEETSPEC_LAB_POD_HOSTS, FLEETSPEC_LAB_QUADLET_HOSTS), taken
down after it; their image is built once in the lab's cache (minutes, cold), by the set-up unless
FLEETSPEC_LAB_CONTAINERS=0 (then the module skips).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time

import pytest

from tests.lab.conftest import FLEET_ROOT, LabFleet, lab_skip_reason
from tests.lab.labtools import fs, json_rows, sh

pytestmark = [pytest.mark.lab]

POD_HOSTS = tuple(os.environ.get("FLEETSPEC_LAB_POD_HOSTS", "pd1").split(","))
QUADLET_HOSTS = tuple(os.environ.get("FLEETSPEC_LAB_QUADLET_HOSTS", "pq1").split(","))
UNIT = "/etc/systemd/system/sglang-qwen.service"
QUADLET_FILE = "/etc/containers/systemd/sglang-qwen.container"
GENERATED = "/run/systemd/generator/sglang-qwen.service"
BOTH = [POD_HOSTS[0], QUADLET_HOSTS[0]]


def container_name(host: str) -> str:
    """pd hosts name their container; Quadlet's default is systemd-%N."""
    return "systemd-sglang-qwen" if host in QUADLET_HOSTS else "sglang"


@pytest.fixture(scope="module")
def pod_fleet():
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    from fleetspec.lab.prepare import containers_wanted

    if not containers_wanted():
        pytest.skip("container lab hosts switched off: FLEETSPEC_LAB_CONTAINERS=0 (their podman image adds "
                    "~4 min to a cold set-up; docs/guide/containers.md)")
    from fleetspec.lab import lab

    hosts = (*POD_HOSTS, *QUADLET_HOSTS)
    result = lab.up(FLEET_ROOT, hosts, log=lambda m: print(m, flush=True))
    fleet = LabFleet(FLEET_ROOT, result.inventory, dict(result.addresses), result.seconds, hosts)
    yield fleet
    if os.environ.get("FLEETSPEC_KEEP_LAB") != "1":
        lab.down(FLEET_ROOT, only=hosts)


def ready(fleet, host, timeout=120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = fleet.run(host, "curl -s -o /dev/null -w '%{http_code}' -m 2 http://127.0.0.1:30000/ready")
        if r.stdout.decode().strip() == "200":
            return True
        time.sleep(1)
    return False


def test_the_engine_runs_in_a_container_and_status_reads_it(pod_fleet):
    host = POD_HOSTS[0]
    assert ready(pod_fleet, host)
    ps = sh(pod_fleet, host, "podman ps --format '{{.Names}} {{.Image}} {{.Command}}'")
    assert "sglang localhost/sglang-lab:0.5.23" in ps
    # the engine is a child of the unit's own cgroup (cgroups disabled): systemd sees it
    cgroup = sh(pod_fleet, host, "cat /proc/$(pgrep -f '^/opt/sglang/venv/bin/python3 -m sglang.launch_server')/cgroup")
    assert "sglang-qwen.service" in cgroup
    digest = sh(pod_fleet, host, "podman image inspect --format '{{.Digest}}' localhost/sglang-lab:0.5.23").strip()
    r = fs(pod_fleet, "status", host, "--json", check_rc=0)
    row = next(r for r in json_rows(r.stdout) if r.get("host") == host)
    c = row["container"]
    assert (c["runtime"], c["image"], c["state"], c["digest"]) == ("podman", "localhost/sglang-lab:0.5.23",
                                                                    "running", digest)
    assert c["version"] == "podman version 4.3.1" and c["restarts"] == 0


def snapshot(fleet, host) -> str:
    """The unit's bytes (a Quadlet host: its .container file and the unit generated from it), the
    drop-ins, the image's id and digest, and the running container's image and release label:
    what a rollback must bring back exactly."""
    files = f"{QUADLET_FILE} {GENERATED}" if host in QUADLET_HOSTS else UNIT
    return sh(fleet, host, f"sha256sum {files}; ls {UNIT}.d 2>/dev/null; "
                           "podman image inspect --format '{{.Id}} {{.Digest}}' localhost/sglang-lab:0.5.23; "
                           "podman inspect --type container --format "
                           f"'{{{{.Image}}}} label={{{{index .Config.Labels \"fleetspec.release\"}}}}' {container_name(host)}")


def on_baseline(fleet, host, before: str) -> None:
    assert ready(fleet, host)
    assert snapshot(fleet, host) == before
    assert before.splitlines()[-1].endswith(" label=")      # the baseline's container carries no release


# another service's release secrets on the same host, which the engine's container must not see
OTHER_SECRET = "/var/lib/fleetspec/other-svc/releases/r0/secrets/env"
INSIDE = """
import json, os, sys
rdir, other = sys.argv[1], sys.argv[2]
def ls(p):
    return sorted(os.listdir(p)) if os.path.isdir(p) else None
try:
    open(os.path.join(rdir, "probe"), "w")
    writable = True
except OSError:
    writable = False
print(json.dumps({"root": ls("/var/lib/fleetspec"), "service": ls("/var/lib/fleetspec/sglang-qwen"),
                  "releases": ls("/var/lib/fleetspec/sglang-qwen/releases"), "other_secret": os.path.exists(other),
                  "baseline": os.path.exists("/var/lib/fleetspec/sglang-qwen/baseline"),
                  "run": os.path.exists("/var/lib/fleetspec/run"), "overlay": os.path.isdir(rdir + "/overlay"),
                  "writable": writable}))
"""


def deployed(r) -> dict:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("host", BOTH)
def test_deploy_and_rollback_on_a_container_unit(pod_fleet, host):
    """The whole deploy (smoke in the image, drop-in, restart, probes, gates) and the rollback to
    the exact unit (or Quadlet file) bytes and image; status and history show the container and its
    release. On the Quadlet host the .container file and the generated unit are never written."""
    assert ready(pod_fleet, host)
    before = snapshot(pod_fleet, host)
    digest = before.splitlines()[-2].split()[1]
    sh(pod_fleet, host, f"mkdir -p {os.path.dirname(OTHER_SECRET)} && umask 077 && echo 'TOKEN=sk-other' > {OTHER_SECRET}")
    if host in QUADLET_HOSTS:          # an edit not loaded yet: the deploy's reload would start it, so refused
        saved = sh(pod_fleet, host, f"base64 -w0 {QUADLET_FILE}").strip()
        sh(pod_fleet, host, f"echo '# tuned by hand, not loaded' >> {QUADLET_FILE}")
        try:
            r = fs(pod_fleet, "deploy", host, "--algo", "ddtree", "--yes")
            said = r.stdout + r.stderr
            assert r.returncode == 3 and "NeedDaemonReload=yes" in said, (r.stdout[-2000:], r.stderr[-2000:])
            assert f"run ssh {host} 'systemctl daemon-reload'" in r.stderr and "Traceback" not in said
            assert not sh(pod_fleet, host, f"ls {UNIT}.d 2>/dev/null; true").strip()     # nothing written
        finally:
            sh(pod_fleet, host, f"echo {saved} | base64 -d > {QUADLET_FILE} && systemctl daemon-reload")
        assert snapshot(pod_fleet, host) == before
    out = deployed(fs(pod_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--json"))
    release = out["release"]
    assert out["status"] == "healthy", out
    shown = sh(pod_fleet, host, "systemctl show -p ExecStart --value sglang-qwen.service")
    assert f"--label fleetspec.release={release}" in shown and "--pull=never" in shown
    if host in QUADLET_HOSTS:          # the drop-in sits on the generated unit; Quadlet's words stay
        assert "--name systemd-sglang-qwen --cidfile=/run/sglang-qwen.cid" in shown
        assert snapshot(pod_fleet, host).splitlines()[:2] == before.splitlines()[:2]
        recorded = json.loads(sh(pod_fleet, host, "cat /var/lib/fleetspec/sglang-qwen/baseline/baseline.json"))
        assert list(recorded["sources"]) == [QUADLET_FILE] and recorded["unit_path"] == GENERATED
    rdir = f"/var/lib/fleetspec/sglang-qwen/releases/{release}"
    assert f"-v {rdir}:{rdir}:ro" in shown and "DDTREE" in shown and "/var/lib/fleetspec:" not in shown
    # from inside the engine's container (root there): only this release's folder, read-only; another
    # service's secrets, this service's baseline and the run folder are not there
    seen = json.loads(sh(pod_fleet, host, f"podman exec {container_name(host)} /opt/sglang/venv/bin/python3 -c "
                                          f"{shlex.quote(INSIDE)} {rdir} {OTHER_SECRET}"))
    assert seen == {"root": ["sglang-qwen"], "service": ["releases"], "releases": [release], "other_secret": False,
                    "baseline": False, "run": False, "overlay": True, "writable": False}, seen
    sh(pod_fleet, host, f"rm -rf {OTHER_SECRET.split('/releases/')[0]}")
    image_id, label = snapshot(pod_fleet, host).splitlines()[-1].split()
    assert label == f"label={release}" and image_id == before.splitlines()[-2].split()[0]   # the same image, labelled
    baseline = json.loads(sh(pod_fleet, host, "cat /var/lib/fleetspec/sglang-qwen/baseline/baseline.json"))
    assert baseline["container"]["digest"] == digest and baseline["container"]["image"] == "localhost/sglang-lab:0.5.23"
    row = next(r for r in json_rows(fs(pod_fleet, "status", host, "--json", check_rc=0).stdout) if r.get("host") == host)
    assert (row["container"]["release_label"], row["container"]["digest"], row["container"]["state"]) == (
        release, digest, "running")
    story = " ".join(fs(pod_fleet, "history", host, release, check_rc=0).stdout.split())     # unwrapped
    assert f"container: podman localhost/sglang-lab:0.5.23 ({digest}), label fleetspec.release={release}" in story
    assert re.search(r"the image's sglang 0\.5\.23: pristine \(\d{4,} files checked against RECORD\)", story), story
    if host in QUADLET_HOSTS:          # an edit of the Quadlet file not yet loaded: the rollback undoes it
        sh(pod_fleet, host, f"echo '# edited during the release' >> {QUADLET_FILE}")
    fs(pod_fleet, "rollback", host, check_rc=0)
    on_baseline(pod_fleet, host, before)


def test_rollback_sh_by_hand_restores_the_unit_and_image(pod_fleet):
    """rollback.sh by hand, after `baseline --retake` recorded the image as a deploy's baseline does."""
    host = POD_HOSTS[0]
    assert ready(pod_fleet, host)
    before = snapshot(pod_fleet, host)
    fs(pod_fleet, "baseline", host, "--retake", check_rc=0)
    baseline = json.loads(sh(pod_fleet, host, "cat /var/lib/fleetspec/sglang-qwen/baseline/baseline.json"))
    assert (baseline["container"]["image_id"], baseline["container"]["digest"]) == tuple(before.splitlines()[-2].split())
    deployed(fs(pod_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", "--json"))
    out = sh(pod_fleet, host, "sh /var/lib/fleetspec/sglang-qwen/current/rollback.sh", timeout=180)
    assert "back on baseline" in out
    on_baseline(pod_fleet, host, before)


@pytest.mark.parametrize("host", BOTH)
def test_a_release_that_crashes_at_start_reverts_to_the_baseline(pod_fleet, host):
    assert ready(pod_fleet, host)
    before = snapshot(pod_fleet, host)
    fs(pod_fleet, "lab", "fault", host, "crash_at_start", "only_algorithm=DDTREE", check_rc=0)
    try:
        r = fs(pod_fleet, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates", "--json")
    finally:
        fs(pod_fleet, "lab", "fault", host, "--clear", check_rc=0)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "rolled_back" and out["failed_step"] == "probes", out
    assert "main process exited with status 1" in out["reason"], out     # the container's exit, at once
    on_baseline(pod_fleet, host, before)
    row = next(r for r in json_rows(fs(pod_fleet, "status", host, "--json", check_rc=0).stdout) if r.get("host") == host)
    assert row["container"]["release_label"] is None and row["container"]["state"] == "running"


def test_smoke_container_sees_the_release_first_and_the_images_sglang(pod_fleet):
    """with_release's run options and smoke_argv's container, run by the real podman on the host."""
    from fleetspec.lab import profiles
    from fleetspec.model import container_launch

    host, root = POD_HOSTS[0], "/var/lib/fleetspec/lab-try"
    sh(pod_fleet, host, f"mkdir -p {root}/r1/overlay/probe && echo 'WHERE = __file__' > {root}/r1/overlay/probe/__init__.py")
    run = container_launch.parse_run(profiles.PODMAN_ARGV)
    argv = container_launch.with_release(run, run.engine.argv, release_id="r1", release_dir=f"{root}/r1",
                                         env={"PYTHONPATH": f"{root}/r1/overlay"})
    release = argv[run.image_at:argv.index(run.image)]
    smoke = container_launch.smoke_argv(run, release, ["-c", "import probe, sglang; print(probe.WHERE, sglang.__file__)"])
    try:
        out = sh(pod_fleet, host, shlex.join(smoke), timeout=120).split()
    finally:
        sh(pod_fleet, host, f"rm -rf {root}")
    assert out == [f"{root}/r1/overlay/probe/__init__.py",
                   "/opt/sglang/venv/lib/python3.11/site-packages/sglang/__init__.py"]

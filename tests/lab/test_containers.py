"""A host whose engine runs under `podman run` (the lab's pd hosts, docs/guide/containers.md): the
engine really runs in a container inside the nspawn host, fleetspec's status reads the real
container, `deploy --plan` shows it and a deploy is still refused with nothing changed, and an
engine that crashes at start fails the unit at once.

One pd host for the module (FLEETSPEC_LAB_POD_HOSTS, default pd1), taken down after it; its image
is built once in the lab's cache (minutes, cold). Opt-in: the module runs with
FLEETSPEC_LAB_CONTAINERS=1 (set-up then builds the image too), and skips otherwise.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.lab.conftest import FLEET_ROOT, LabFleet, lab_skip_reason
from tests.lab.labtools import fs, json_rows, sh

pytestmark = [pytest.mark.lab]

POD_HOSTS = tuple(os.environ.get("FLEETSPEC_LAB_POD_HOSTS", "pd1").split(","))
UNIT = "/etc/systemd/system/sglang-qwen.service"


@pytest.fixture(scope="module")
def pod_fleet():
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    from fleetspec.lab.prepare import containers_wanted

    if not containers_wanted():
        pytest.skip("container lab hosts are opt-in: FLEETSPEC_LAB_CONTAINERS=1 (their podman image adds "
                    "~4 min to a cold set-up; docs/guide/containers.md)")
    from fleetspec.lab import lab

    result = lab.up(FLEET_ROOT, POD_HOSTS, log=lambda m: print(m, flush=True))
    fleet = LabFleet(FLEET_ROOT, result.inventory, dict(result.addresses), result.seconds, POD_HOSTS)
    yield fleet
    if os.environ.get("FLEETSPEC_KEEP_LAB") != "1":
        lab.down(FLEET_ROOT, only=POD_HOSTS)


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


def test_plan_shows_the_container_and_a_deploy_changes_nothing(pod_fleet):
    host = POD_HOSTS[0]
    before = sh(pod_fleet, host, f"sha256sum {UNIT}; ls /etc/systemd/system/sglang-qwen.service.d 2>/dev/null; "
                                 "podman image inspect --format '{{.Digest}}' localhost/sglang-lab:0.5.23")
    plan = fs(pod_fleet, "deploy", host, "--algo", "ddtree", "--plan", check_rc=0)
    assert "podman" in plan.stdout and "localhost/sglang-lab:0.5.23" in plan.stdout
    assert "--speculative-algorithm DDTREE" in plan.stdout or "DDTREE" in plan.stdout
    refused = fs(pod_fleet, "deploy", host, "--algo", "ddtree", "--yes")
    assert refused.returncode == 2 and "planned only" in refused.stdout + refused.stderr
    assert sh(pod_fleet, host, f"sha256sum {UNIT}; ls /etc/systemd/system/sglang-qwen.service.d 2>/dev/null; "
                               "podman image inspect --format '{{.Digest}}' localhost/sglang-lab:0.5.23") == before


def test_a_container_that_crashes_at_start_fails_the_unit_at_once(pod_fleet):
    host = POD_HOSTS[0]
    sh(pod_fleet, host, "echo " + json.dumps(json.dumps({"crash_at_start": True})) + " > /etc/fleetspec-lab/faults.json")
    try:
        t0 = time.monotonic()
        sh(pod_fleet, host, "systemctl restart sglang-qwen.service")
        restarts = 0
        while time.monotonic() - t0 < 90 and restarts < 1:
            time.sleep(1)
            restarts = int(sh(pod_fleet, host, "systemctl show -p NRestarts --value sglang-qwen.service"))
        assert restarts >= 1
        log = sh(pod_fleet, host, "journalctl -u sglang-qwen.service --no-pager -n 60")
        assert "Failed with result 'exit-code'" in log
    finally:
        sh(pod_fleet, host, "rm -f /etc/fleetspec-lab/faults.json; systemctl restart sglang-qwen.service")
    assert ready(pod_fleet, host)


def test_smoke_container_sees_the_release_first_and_the_images_sglang(pod_fleet):
    """with_release's run options and smoke_argv's container, run by the real podman on the host."""
    import shlex

    from fleetspec.lab import profiles
    from fleetspec.model import container_launch

    host, root = POD_HOSTS[0], "/var/lib/fleetspec/lab-try"
    sh(pod_fleet, host, f"mkdir -p {root}/r1/overlay/probe && echo 'WHERE = __file__' > {root}/r1/overlay/probe/__init__.py"
                        f" && ln -sfn r1 {root}/current")
    run = container_launch.parse_run(profiles.PODMAN_ARGV)
    argv = container_launch.with_release(run, run.engine.argv, release_id="r1", root=root,
                                         env={"PYTHONPATH": f"{root}/current/overlay"})
    release = argv[run.image_at:argv.index(run.image)]
    smoke = container_launch.smoke_argv(run, release, ["-c", "import probe, sglang; print(probe.WHERE, sglang.__file__)"])
    try:
        out = sh(pod_fleet, host, shlex.join(smoke), timeout=120).split()
    finally:
        sh(pod_fleet, host, f"rm -rf {root}")
    assert out == [f"{root}/current/overlay/probe/__init__.py",
                   "/opt/sglang/venv/lib/python3.11/site-packages/sglang/__init__.py"]

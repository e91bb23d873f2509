"""Status's container field (ops.container_plan.container_status, Quadlet's name specifiers too),
the forms preflight refuses, and a container's secret-looking `-e` values kept out of what is shown.
Facts are output captured from podman 4.3.1; the facts' command runs over the loopback sshd, with a
runtime stand-in that prints that output (no container runs on this machine)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fleetspec.ops import container_plan
from fleetspec.remote.facts import container_inspect, unit_files

ROOT = Path(__file__).parents[2]
CAPTURED = ROOT / "tests" / "fixtures" / "containers"
ARGV = ("/usr/bin/podman run --rm --name sglang --ipc=host --device nvidia.com/gpu=all -e HF_TOKEN=hf_abcdef "
        "-v /root/.cache/huggingface:/root/.cache/huggingface localhost/fleetspec-probe:1 python3 -m "
        "sglang.launch_server --model-path /models/q --port 30000 --speculative-algorithm EAGLE "
        "--speculative-num-steps 3 --speculative-draft-attention-backend fa3")


def _captured() -> container_inspect.Inspected:
    return container_inspect.Inspected("podman version 4.3.1",
                                       container_inspect.parse_image((CAPTURED / "podman-4.3.1-image-inspect.json").read_text()),
                                       container_inspect.parse_container(
                                           (CAPTURED / "podman-4.3.1-container-inspect-created.json").read_text()))


def _stand_in(tmp_path) -> Path:
    """A `podman` that answers like podman 4.3.1 did here (its captured output), for the facts' shell."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runtime = bin_dir / "podman"
    image, container = CAPTURED / "podman-4.3.1-image-inspect.json", CAPTURED / "podman-4.3.1-container-inspect-created.json"
    runtime.write_text("#!/bin/sh\n"
                       'case "$1 $2" in\n'
                       '  "--version ") echo "podman version 4.3.1";;\n'
                       f'  "image inspect") [ "$4" = localhost/fleetspec-probe:1 ] && cat {shlex.quote(str(image))} '
                       '|| { echo "[]"; echo "Error: no such image" >&2; exit 125; };;\n'
                       f'  "inspect --type") [ "$5" = fleetspec-probe ] && cat {shlex.quote(str(container))} '
                       '|| { echo "[]"; exit 125; };;\n'
                       "  *) exit 2;;\nesac\n")
    runtime.chmod(0o755)
    return runtime


def test_inspect_fact_over_ssh_and_status_field(t, tmp_path):
    from fleetspec.remote import facts

    runtime = _stand_in(tmp_path)
    got = facts.gather(t, container_inspect, runtime=str(runtime), image="localhost/fleetspec-probe:1",
                       container="fleetspec-probe")
    assert got == _captured()
    missing = facts.gather(t, container_inspect, runtime=str(runtime), image="nope:1", container="gone")
    assert missing.version == "podman version 4.3.1" and missing.image is None and missing.container is None
    unit = (f"[Service]\nExecStart={runtime} run --rm --name fleetspec-probe -e HF_TOKEN=x "
            f"localhost/fleetspec-probe:1 python3 -m sglang.launch_server --model-path /models/q\n").encode()
    files = unit_files.UnitFiles("/etc/systemd/system/s.service", unit, {})
    status = container_plan.container_status(t, files, "s.service")
    assert status == {"runtime": "podman", "version": "podman version 4.3.1", "image": "localhost/fleetspec-probe:1",
                      "image_id": "d42aa19a524fce4f50fd5898a58bf4758469335bea77d95e1cab05d1e4227fbe",
                      "digest": "sha256:7c730c8e6bf3943e13b7e4ba41e87cdea9542487e7ea744ff86530634e968630",
                      "container": "fleetspec-probe", "state": "created", "restarts": 0, "health": None,
                      "release_label": "20261203T000000Z-ddtree-0001"}
    assert container_plan.status_line(status) == ("container: podman localhost/fleetspec-probe:1 (sha256:7c730c8e6bf3943"
                                                  "e13b7e4ba41e87cdea9542487e7ea744ff86530634e968630); fleetspec-probe "
                                                  "created, restarts 0; label fleetspec.release=20261203T000000Z-"
                                                  "ddtree-0001")
    bare = unit_files.UnitFiles("/u", b"[Service]\nExecStart=/opt/v/bin/python3 -m sglang.launch_server\n", {})
    assert container_plan.container_status(t, bare, "s.service") is None


@pytest.mark.parametrize("argv,why", [
    ("/usr/bin/docker compose -f /opt/c.yaml up", "plans `docker run`/`podman run` units only"),
    ("/usr/bin/docker run img bash -c x", "shell wrapper"),
])
def test_preflight_refuses_what_it_cannot_plan(argv, why):
    from fleetspec.errors import UserError
    from fleetspec.ops import argv as argv_ops
    from fleetspec.systemd_unit import ExecCommand

    words = argv.split()
    with pytest.raises(UserError, match=why):
        argv_ops.classify_or_refuse(ExecCommand(words[0], tuple(words)), "h: s")
    run = argv_ops.classify_or_refuse(ExecCommand("/usr/bin/docker", tuple(ARGV.replace("/usr/bin/podman", "/usr/bin/docker")
                                                                         .split())), "h: s")
    assert run.runtime == "docker"


def test_secret_looking_env_values_are_never_shown():
    from fleetspec.ops.redaction import argv_secrets

    words = ("docker --log-level debug run --env=HF_TOKEN=s1 -eAPI_KEY=s2 -ie MY_SECRET=s3 -e MODEL=m --env HF_TOKEN "
             "img python3 -m sglang.launch_server --model-path m --api-key s4").split()
    assert argv_secrets(words) == ["s1", "s2", "s3", "s4"]

"""`deploy --plan` on a container unit (ops.container_plan): what it would run, from the parsed unit
and the host's facts (output captured from podman 4.3.1), as a Quadlet unit's deploy is planned only;
status's container field. The facts' command runs over the loopback sshd, with a runtime stand-in
that prints the captured `podman inspect` output (no container runs on this machine)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fleetspec.model.container_launch import parse_run
from fleetspec.model.inventory import load_inventory
from fleetspec.model.playbook import load_playbook
from fleetspec.ops import container_plan
from fleetspec.ops.outcome import DeployRequest
from fleetspec.remote.facts import container_inspect, unit_files

ROOT = Path(__file__).parents[2]
CAPTURED = ROOT / "tests" / "fixtures" / "containers"
ARGV = ("/usr/bin/podman run --rm --name sglang --ipc=host --device nvidia.com/gpu=all -e HF_TOKEN=hf_abcdef "
        "-v /root/.cache/huggingface:/root/.cache/huggingface localhost/fleetspec-probe:1 python3 -m "
        "sglang.launch_server --model-path /models/q --port 30000 --speculative-algorithm EAGLE "
        "--speculative-num-steps 3 --speculative-draft-attention-backend fa3")


def _request(tmp_path, sshd, key, writer, extra: str = "{sglang_version: 0.5.23}"):
    inv = writer(tmp_path / "inv.yaml", {"h": sshd}, key,
                 host_vars={"h": f"{{extra: {extra}, draft_model_path: /models/draft}}"})
    host = load_inventory(inv).hosts["h"]
    return DeployRequest(host=host, playbook=load_playbook(ROOT / "playbooks" / "ddtree.yaml"), root=ROOT)


def _captured() -> container_inspect.Inspected:
    return container_inspect.Inspected("podman version 4.3.1",
                                       container_inspect.parse_image((CAPTURED / "podman-4.3.1-image-inspect.json").read_text()),
                                       container_inspect.parse_container(
                                           (CAPTURED / "podman-4.3.1-container-inspect-created.json").read_text()))


def test_plan_shows_runtime_image_digest_and_the_derived_engine_command(tmp_path, sshd, ssh_client_key, inventory_writer):
    req = _request(tmp_path, sshd, ssh_client_key, inventory_writer)
    run = parse_run(ARGV.split())
    plan = container_plan.build_plan(req, "sglang.service", run, _captured())
    text = "\n".join(plan.notes)
    assert "runtime: podman version 4.3.1" in text
    assert "image localhost/fleetspec-probe:1: id d42aa19a524f, digest sha256:7c730c8e6bf3" in text
    assert "container fleetspec-probe: created, restarts 0" in text
    assert "runtime options kept byte for byte: --rm --name --ipc --device -e -v" in text
    assert plan.sglang == "0.5.23" and plan.steps[-1].startswith("planned only")
    launch = plan.launch
    assert launch["baseline_algorithm"] == "EAGLE" and launch["added"][:2] == ["--speculative-algorithm", "DDTREE"]
    assert ["--speculative-draft-attention-backend", "fa3"] in launch["carried"]
    assert launch["runtime_words"] == ARGV.split()[:ARGV.split().index("localhost/fleetspec-probe:1") + 1]
    assert "+DDTREE" in plan.execstart_diff and "-EAGLE" in plan.execstart_diff
    assert "hf_abcdef" not in plan.execstart_diff + plan.dropin      # a secret-looking -e value is not shown
    assert "HF_TOKEN=<redacted>" in plan.dropin and plan.dropin.startswith("# planned only")
    spec = parse_run(ARGV.replace("-e HF_TOKEN", "-e SGLANG_ENABLE_SPEC_V2=1 -e HF_TOKEN").split())
    assert any("-e/--env stay as written" in n and "SGLANG_ENABLE_SPEC_V2" in n
               for n in container_plan.build_plan(req, "s", spec, _captured()).notes)
    refusal = container_plan.ContainerPlanned("h: sglang.service", run, plan)
    assert str(refusal).startswith("h: sglang.service: deploys onto Quadlet units are planned only (podman run "
                                   "localhost/fleetspec-probe:1") and refusal.exit_code == 2 and "\n" not in str(refusal)


def test_plan_without_the_images_sglang_version_says_so(tmp_path, sshd, ssh_client_key, inventory_writer):
    req = _request(tmp_path, sshd, ssh_client_key, inventory_writer, extra="{}")
    plan = container_plan.build_plan(req, "s", parse_run(ARGV.split()), None)
    assert plan.launch is None and plan.execstart_diff == ""
    assert any("not derived: the sglang version inside the image is not known" in n for n in plan.notes)
    assert any("podman: not found on the host" in n for n in plan.notes)


def test_image_entrypoint_in_front_of_the_command_is_noted():
    run = parse_run("docker run img python3 -m sglang.launch_server --model-path m".split())
    wrapped = container_inspect.parse_image((CAPTURED / "podman-4.3.1-image-inspect-entrypoint.json").read_text())
    notes = container_plan.fact_notes(run, container_inspect.Inspected("Docker version 28.2.2", wrapped, None))
    assert any("ENTRYPOINT ['/bin/true', '--wrapped'] runs in front of the command" in n for n in notes)
    assert "container: unnamed (no --name), not looked up" in notes


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
    status = container_plan.container_status(t, files)
    assert status == {"runtime": "podman", "version": "podman version 4.3.1", "image": "localhost/fleetspec-probe:1",
                      "image_id": "d42aa19a524fce4f50fd5898a58bf4758469335bea77d95e1cab05d1e4227fbe",
                      "digest": "sha256:7c730c8e6bf3943e13b7e4ba41e87cdea9542487e7ea744ff86530634e968630",
                      "container": "fleetspec-probe", "state": "created", "restarts": 0, "health": None,
                      "release_label": "20261203T000000Z-ddtree-0001"}
    assert container_plan.status_line(status) == ("container: podman localhost/fleetspec-probe:1 (sha256:7c730c8e6bf3943"
                                                  "e13b7e4ba41e87cdea9542487e7ea744ff86530634e968630); fleetspec-probe "
                                                  "created, restarts 0")
    bare = unit_files.UnitFiles("/u", b"[Service]\nExecStart=/opt/v/bin/python3 -m sglang.launch_server\n", {})
    assert container_plan.container_status(t, bare) is None


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


def test_cli_prints_a_container_plan(tmp_path, sshd, ssh_client_key, inventory_writer, capsys):
    from fleetspec.cli.deploy_cmd import _print_plan
    from fleetspec.ops.outcome import DeployOutcome, Outcome

    req = _request(tmp_path, sshd, ssh_client_key, inventory_writer)
    plan = container_plan.build_plan(req, "sglang.service", parse_run(ARGV.split()), _captured())
    _print_plan(DeployOutcome("h", Outcome.PLANNED, plan=plan))
    out = capsys.readouterr().out
    assert "ExecStart form: podman run localhost/fleetspec-probe:1 (python -m sglang.launch_server)" in out
    assert "note: h: image localhost/fleetspec-probe:1: id d42aa19a524f" in out
    assert "steps: preflight -> planned only (Quadlet units are refused)" in out


def test_secret_looking_env_values_are_never_shown():
    words = ("docker --log-level debug run --env=HF_TOKEN=s1 -eAPI_KEY=s2 -ie MY_SECRET=s3 -e MODEL=m --env HF_TOKEN "
             "img python3 -m sglang.launch_server --model-path m").split()
    assert container_plan.shown(parse_run(words), words)[4:12] == [
        "--env=HF_TOKEN=<redacted>", "-eAPI_KEY=<redacted>", "-ie", "MY_SECRET=<redacted>", "-e", "MODEL=m",
        "--env", "HF_TOKEN"]

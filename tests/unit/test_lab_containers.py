"""The lab's container hosts (pd<N>): their profile, unit and podman settings, read by the same
parsers fleetspec uses on a real fleet."""

import shlex
import tomllib
from pathlib import Path

import pytest

from fleetspec.lab import hosts, podman_image, profiles
from fleetspec.model import container_launch
from fleetspec.remote.facts import container_inspect
from fleetspec.systemd_unit import parse_unit


@pytest.mark.parametrize("name,like", [("pd1", "podman"), ("pd42", "podman"), ("pdx", "ct200"), ("ct200", "ct200")])
def test_pd_names_are_container_hosts(name, like):
    assert profiles.for_host(name).like == like
    assert profiles.for_host(name).container is (like == "podman")


def test_pd_unit_runs_ct200s_engine_under_podman_run():
    p = profiles.for_host("pd1")
    unit = profiles.unit_text(p)
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(line[len("ExecStart="):])
    run = container_launch.parse_run(argv)
    assert run.runtime == "podman" and argv[run.image_at] == podman_image.image_name("0.5.23")
    assert list(run.engine.argv) == profiles.CT200_ARGV     # the engine command is ct200's, byte for byte
    names = [o.name for o in run.options]
    assert {"--rm", "--name", "--network", "--ipc", "-v"} <= set(names)
    # podman 4.3.1 refuses `--shm-size` with `--ipc host` (docker takes it): the lab unit must start
    assert "--shm-size" not in names


def test_pd_unit_removes_a_stale_container_and_stops_with_time_to_drain():
    unit = parse_unit(profiles.unit_text(profiles.for_host("pd1")))
    assert unit.values("Service", "ExecStartPre") == [f"-{profiles.PODMAN} rm -f --ignore sglang"]
    assert unit.values("Service", "ExecStop") == [f"{profiles.PODMAN} stop -t 50 sglang"]
    assert int(unit.values("Service", "TimeoutStopSec")[0]) > 50     # podman's own timeout fires first


def test_only_container_hosts_get_the_podman_layer():
    bare, pod = hosts.lowerdirs(profiles.for_host("ct200")), hosts.lowerdirs(profiles.for_host("pd1"))
    assert podman_image.podman_layer() not in bare
    assert pod == [podman_image.podman_layer(), *bare]


def test_podman_settings_that_work_inside_an_nspawn_host():
    conf = tomllib.loads(podman_image.CONTAINERS_CONF)
    assert conf["containers"]["cgroups"] == "disabled"      # the host's cgroups are read-only
    assert conf["containers"]["keyring"] is False           # nspawn's seccomp filter refuses keyctl
    assert conf["engine"]["cgroup_manager"] == "cgroupfs"
    storage = tomllib.loads(podman_image.STORAGE_CONF)
    assert storage["storage"]["driver"] == "overlay"
    assert storage["storage"]["runroot"] and storage["storage"]["graphroot"] == "/var/lib/containers/storage"
    assert storage["storage"]["options"]["additionalimagestores"] == [podman_image.IMAGE_STORE]
    assert podman_image.PODMAN_RECIPE["files"]["/etc/containers/storage.conf"] == podman_image.STORAGE_CONF


def test_image_store_name_follows_the_engine_and_the_venv(monkeypatch):
    before = podman_image.image_layer("0.5.23")
    from fleetspec.lab import engine

    real = engine.files
    monkeypatch.setattr(engine, "files", lambda: {**real(), "fleetspec_lab_engine/extra.py": b"x = 1\n"})
    assert podman_image.image_layer("0.5.23") != before
    assert podman_image.image_layer("0.5.23").name.startswith("image-0.5.23-")


RDIR = "/var/lib/fleetspec/sglang-qwen/releases/20261203T2230-ddtree-0a1b2c"


def test_release_run_options_go_just_before_the_image_and_keep_every_operator_word():
    argv = profiles.PODMAN_ARGV
    run = container_launch.parse_run(argv)
    new = container_launch.with_release(run, run.engine.argv, release_id="20261203T2230-ddtree-0a1b2c",
                                        release_dir=RDIR, env={"PYTHONPATH": f"{RDIR}/overlay"})
    image_at = new.index(podman_image.image_name("0.5.23"))
    assert new[:run.image_at] == list(argv[:run.image_at])           # the operator's words, in place
    assert new[image_at:] == list(argv[run.image_at:])               # the image and the engine command
    assert new[run.image_at:image_at] == [
        "--pull=never", "--label", "fleetspec.release=20261203T2230-ddtree-0a1b2c",
        "-v", f"{RDIR}:{RDIR}:ro", "-e", f"PYTHONPATH={RDIR}/overlay"]       # the release folder only
    again = container_launch.parse_run(new)                          # podman's own parser rules
    assert again.image == podman_image.image_name("0.5.23") and list(again.engine.argv) == list(run.engine.argv)
    assert again.option("--label") == ["fleetspec.release=20261203T2230-ddtree-0a1b2c"]


def test_release_refuses_an_operator_pythonpath_it_would_hide():
    argv = [*profiles.PODMAN_RUN[:-1], "-e", "PYTHONPATH=/opt/mine", *profiles.PODMAN_ARGV[len(profiles.PODMAN_RUN) - 1:]]
    run = container_launch.parse_run(argv)
    with pytest.raises(container_launch.LaunchRefused, match="PYTHONPATH"):
        container_launch.with_release(run, run.engine.argv, release_id="r", release_dir=RDIR,
                                      env={"PYTHONPATH": f"{RDIR}/overlay"})


CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "containers"


def test_inspect_of_the_lab_hosts_running_engine_container():
    """`container_inspect.command` run on a pd host while its unit ran (README: how captured)."""
    got = container_inspect.parse((CAPTURES / "podman-4.3.1-lab-running.txt").read_text())
    assert got.version == "podman version 4.3.1"
    assert got.image and got.image.digest and got.image.digest.startswith("sha256:")
    assert got.image.entrypoint == () and got.image.cmd == ()      # `podman import` sets neither
    c = got.container
    assert c and (c.name, c.status, c.running, c.restart_count, c.exit_code) == ("sglang", "running", True, 0, 0)
    assert c.image_id == got.image.id and c.image_name == podman_image.image_name("0.5.23")
    assert "sglang.launch_server" in c.args and c.health is None


def test_inspect_of_an_exited_container_and_of_one_being_removed_by_rm():
    exited = container_inspect.parse((CAPTURES / "podman-4.3.1-lab-exited.txt").read_text()).container
    assert exited and (exited.status, exited.running, exited.exit_code) == ("exited", False, 3)
    assert exited.labels[container_launch.RELEASE_LABEL] == "20261203T223000-ddtree-0a1b2c"
    # right after `systemctl stop` returned, `--rm`'s clean-up (conmon's exit command) had not run yet
    stopped = container_inspect.parse((CAPTURES / "podman-4.3.1-lab-stopping.txt").read_text()).container
    assert stopped and (stopped.name, stopped.status, stopped.running, stopped.exit_code) == ("sglang", "removing",
                                                                                            False, 0)


def test_smoke_container_has_the_units_mounts_and_the_release_but_no_name_or_ports():
    argv = [*profiles.PODMAN_RUN[:-1], "-dit", "-p", "30000:30000", "--restart=always", "--label", "team=a",
            "--gpus", "all", *profiles.PODMAN_ARGV[len(profiles.PODMAN_RUN) - 1:]]
    run = container_launch.parse_run(argv)
    release = ["--pull=never", "-v", f"{RDIR}:{RDIR}:ro", "-e", "PYTHONPATH=/x/overlay"]
    smoke = container_launch.smoke_argv(run, release, ["-c", "import sglang"])
    assert smoke[:3] == [profiles.PODMAN, "run", "--rm"]
    assert smoke[-4:] == ["/opt/sglang/venv/bin/python3", podman_image.image_name("0.5.23"), "-c", "import sglang"]
    for word in ("--name", "-dit", "-p", "--restart=always", "team=a"):
        assert word not in smoke
    for pair in (["--network", "host"], ["--ipc", "host"], ["-v", "/root/models:/root/models:ro"], ["--gpus", "all"],
                 ["-e", "PYTHONPATH=/x/overlay"]):
        assert any(smoke[i:i + 2] == pair for i in range(len(smoke))), pair
    table = container_launch.load("podman")                         # podman's own parser rules
    opts, image_at = container_launch.split_options(smoke, 2, {**table.main, **table.run}, "`podman run`")
    assert smoke[image_at] == podman_image.image_name("0.5.23")
    assert [o.value for o in opts if o.name == "--entrypoint"] == ["/opt/sglang/venv/bin/python3"]

"""A deploy onto a `podman run` / `docker run` unit: what preflight records and refuses
(ops.container_plan.deployable), the release's host argv and drop-in, the smoke runner's container,
the baseline's image and what rollback checks of the running container. Facts are `podman inspect`
output captured from podman 4.3.1 on the lab's pd hosts (tests/fixtures/containers/README.md); the
facts' command runs over the loopback sshd with a runtime stand-in printing that output."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetspec import systemd_unit, unit_context
from fleetspec.errors import UserError
from fleetspec.lab import profiles
from fleetspec.model import container_launch, launch
from fleetspec.model.baseline import Baseline
from fleetspec.model.container_launch import parse_run
from fleetspec.model.inventory import load_inventory
from fleetspec.model.launch import LaunchRefused
from fleetspec.model.layout import HostLayout
from fleetspec.model.playbook import load_playbook
from fleetspec.ops import container_plan, rendering, smoke_run, staging
from fleetspec.ops.outcome import DeployRequest
from fleetspec.remote.facts import container_inspect

ROOT = Path(__file__).parents[2]
CAPTURED = ROOT / "tests" / "fixtures" / "containers"
LAB_IMAGE = "localhost/sglang-lab:0.5.23"
LAB_DIGEST = "sha256:e67df7ad346903f22ae8baff79a3b8e8c373a6b075983220b5fbf18f7640ecd9"
LAB_ID = "5ceba7788d6354843f00f1cefa05d9a518036b33bed47458b8f8a60c97ba281b"


def _running() -> container_inspect.Inspected:
    """The lab's pd host serving its baseline, as `podman inspect` printed it."""
    return container_inspect.parse((CAPTURED / "podman-4.3.1-lab-running.txt").read_text())


def test_container_facts_are_the_runtime_image_id_and_digest():
    run = parse_run(profiles.PODMAN_ARGV)
    assert container_plan.container_facts("pd1: s", run, _running()) == {
        "runtime": "podman", "version": "podman version 4.3.1", "image": LAB_IMAGE, "image_id": LAB_ID,
        "digest": LAB_DIGEST}


def test_container_facts_refuse_what_a_deploy_cannot_run():
    run = parse_run(profiles.PODMAN_ARGV)
    got = _running()
    with pytest.raises(UserError, match=r"^pd1: s: podman not found on the host \(/usr/bin/podman\)$"):
        container_plan.container_facts("pd1: s", run, dataclasses.replace(got, version=None))
    with pytest.raises(UserError, match="image localhost/sglang-lab:0.5.23 is not on the host; a deploy never pulls"):
        container_plan.container_facts("pd1: s", run, dataclasses.replace(got, image=None))
    wrapped = container_inspect.parse_image((CAPTURED / "podman-4.3.1-image-inspect-entrypoint.json").read_text())
    with pytest.raises(UserError, match=r"ENTRYPOINT \['/bin/true', '--wrapped'\] in front of the engine command"):
        container_plan.container_facts("pd1: s", run, dataclasses.replace(got, image=wrapped))


def test_generated_units_are_told_by_where_the_generator_put_them():
    assert unit_context.is_generated("/run/systemd/generator/sglang.service")
    assert unit_context.is_generated("/run/systemd/generator.late/sglang.service")
    assert not unit_context.is_generated("/etc/systemd/system/sglang-qwen.service")
    assert not unit_context.is_generated("/run/systemd/generatorx/s.service") and not unit_context.is_generated(None)


def test_quadlet_specifiers_resolve_as_the_system_manager_does():
    spec = unit_context.unit_specifiers("sglang-qwen.service")
    assert (spec["n"], spec["N"], spec["p"], spec["i"], spec["j"], spec["t"]) == (
        "sglang-qwen.service", "sglang-qwen", "sglang-qwen", "", "qwen", "/run")
    tpl = unit_context.unit_specifiers("sglang@gpu0.service")
    assert (tpl["N"], tpl["p"], tpl["i"]) == ("sglang@gpu0", "sglang", "gpu0")
    words = systemd_unit.effective_exec_command(
        "[Service]\nExecStart=/usr/bin/podman run --name systemd-%N --cidfile=%t/%N.cid img x\n", (), spec).argv
    assert words[3:6] == ("systemd-sglang-qwen", "--cidfile=/run/sglang-qwen.cid", "img")
    for host_bound in ("%H", "%T"):                # the host's name, the manager's $TMPDIR: only systemd knows
        with pytest.raises(systemd_unit.UnitSyntaxError, match=f"specifier {host_bound} needs the unit's context"):
            systemd_unit.effective_exec_command(f"[Service]\nExecStart=/bin/x {host_bound}\n", (), spec)


def _request(tmp_path, sshd, key, writer, python: str = "/opt/sglang/venv/bin/python3", **kw) -> DeployRequest:
    inv = writer(tmp_path / f"inv-{len(python)}.yaml", {"h": sshd}, key, host_vars={
        "h": f"{{extra: {{sglang_version: 0.5.23}}, draft_model_path: /models/draft, python: {python}}}"})
    return DeployRequest(host=load_inventory(inv).hosts["h"], playbook=load_playbook(ROOT / "playbooks" / "ddtree.yaml"),
                         root=ROOT, **kw)


def _stand_in(tmp_path) -> Path:
    """A `podman` printing the lab's captured image inspect."""
    runtime = tmp_path / "bin" / "podman"
    runtime.parent.mkdir()
    image = CAPTURED / "podman-4.3.1-lab-running.txt"
    runtime.write_text("#!/bin/sh\n"
                       'case "$1 $2" in\n'
                       '  "--version ") echo "podman version 4.3.1";;\n'
                       f'  "image inspect") sed -n "/ image 0$/,/FLEETSPEC-INSPECT container/p" {shlex.quote(str(image))}'
                       " | sed '1d;$d';;\n"
                       "  *) exit 2;;\nesac\n")
    runtime.chmod(0o755)
    return runtime


def test_deployable_reads_the_host_and_refuses_in_one_line(tmp_path, t, sshd, ssh_client_key, inventory_writer):
    runtime = _stand_in(tmp_path)
    run = parse_run([str(runtime), *profiles.PODMAN_ARGV[1:]])
    req = _request(tmp_path, sshd, ssh_client_key, inventory_writer)
    facts = container_plan.deployable(t, req, "s.service", run, fragment_path="/etc/systemd/system/s.service")
    assert (facts["image_id"], facts["digest"]) == (LAB_ID, LAB_DIGEST)
    quadlet = container_plan.deployable(t, req, "s.service", run, fragment_path="/run/systemd/generator/s.service",
                                        source_path="/etc/containers/systemd/s.container")
    assert quadlet == facts
    with pytest.raises(UserError, match=r"^h: s.service: a generator wrote /run/systemd/generator/s.service from "
                                        r"/etc/fstab; fleetspec deploys onto generated units from a Quadlet "
                                        r"\.container file only$"):
        container_plan.deployable(t, req, "s.service", run, fragment_path="/run/systemd/generator/s.service",
                                  source_path="/etc/fstab")
    in_place = dataclasses.replace(req, mode="in-place")
    with pytest.raises(UserError, match="--mode in-place writes into the host's sglang, not the image's"):
        container_plan.deployable(t, in_place, "s.service", run, fragment_path="/etc/s.service")
    pythonpath = parse_run([str(runtime), "run", "-e", "PYTHONPATH=/x", *profiles.PODMAN_ARGV[-len(run.engine.argv) - 1:]])
    with pytest.raises(UserError, match=r"^h: s.service: .*-e PYTHONPATH=…"):
        container_plan.deployable(t, req, "s.service", pythonpath, fragment_path="/etc/s.service")
    serve = parse_run([str(runtime), "run", "--rm", LAB_IMAGE, "sglang", "serve", "--model-path", "/m"])
    with pytest.raises(UserError, match="the smoke tests need the python that runs the engine"):
        container_plan.deployable(t, req, "s.service", serve, fragment_path="/etc/s.service")
    elsewhere = _request(tmp_path, sshd, ssh_client_key, inventory_writer, python="/usr/bin/python3")
    with pytest.raises(UserError, match=r"engine runs /opt/sglang/venv/bin/python3 inside the image, but fleetspec "
                                        r"reads sglang's files with vars.python \(/usr/bin/python3\) on the host"):
        container_plan.deployable(t, elsewhere, "s.service", run, fragment_path="/etc/s.service")


def _preflight(root: Path, files: bool = True):
    from fleetspec.ops import argv as argv_ops
    from fleetspec.ops.preflight_result import Preflight

    run = parse_run(profiles.PODMAN_ARGV)
    playbook = load_playbook(root / "playbooks" / "ddtree.yaml")
    new_argv = [*run.engine.argv[:-2], "--speculative-algorithm", "DDTREE"]
    launch = argv_ops.LaunchPlan(form=run.engine, derived=SimpleNamespace(
        kept=[], dropped=[], carried=[], added=[], changed=[], algorithm="DFLASH"))
    pf = Preflight(host=SimpleNamespace(name="pd1"), root=root, playbook=playbook, service="sglang-qwen.service",
                   python=run.engine.argv[0], unit=None, unit_bytes=b"", dropins={}, exec_argv=list(run.argv),
                   sglang=SimpleNamespace(version="0.5.23", site_packages="/opt/sglang/venv/lib/python3.11/site-packages"),
                   torch=None, hybrid=False, options=SimpleNamespace(values={}), new_argv=new_argv,
                   patchset=SimpleNamespace(files=[SimpleNamespace(path="sglang/x.py", base_sha256="ab")],
                                            root=Path("ps")) if files else None, kernels=[],
                   form=run.engine, launch=launch, container=run, container_facts={"image": LAB_IMAGE})
    return pf, run


def test_a_container_release_runs_the_same_runtime_words_with_the_release_mounted_and_labelled():
    pf, run = _preflight(ROOT)
    release = staging.new_release(pf, "20261204T000000Z-ddtree-0001", patch_files={"sglang/x.py": b"x = 1\n"},
                                  kernel_files={})
    rdir = f"/var/lib/fleetspec/sglang-qwen/releases/{release.id}"
    env = {**pf.playbook.launch.env, "PYTHONPATH": f"{rdir}/overlay"}      # the playbook's, then the release's
    assert release.argv == container_launch.with_release(run, pf.new_argv, release_id=release.id, release_dir=rdir,
                                                         env=env)
    at = release.argv.index(LAB_IMAGE)
    assert release.argv[:run.image_at] == list(run.argv[:run.image_at])     # the operator's words, in place
    # only this release's folder, read-only: never the state root (other services' baselines, secrets)
    assert release.argv[run.image_at:at] == ["--pull=never", "--label", f"fleetspec.release={release.id}", "-v",
                                             f"{rdir}:{rdir}:ro", *[w for k, v in env.items() for w in ("-e", f"{k}={v}")]]
    assert not any(w.startswith("/var/lib/fleetspec:") for w in release.argv)
    assert release.argv[at + 1:] == pf.new_argv
    assert (release.exec_prefix, release.exec_path) == ("", None)
    # the drop-in's ExecStart= is that argv, as systemd reads it back
    text = rendering.dropin_text(pf, release)
    lines = [ln for ln in text.splitlines() if ln.startswith("ExecStart=") and ln != "ExecStart="]
    assert [list(c.argv) for c in systemd_unit.parse_exec(lines[0][len("ExecStart="):])] == [release.argv]


def test_the_smoke_runner_runs_in_the_units_image_with_the_releases_overlay_first():
    pf, run = _preflight(ROOT)
    rdir = str(HostLayout("sglang-qwen.service").release("r1"))
    overlay = f"{rdir}/overlay"
    argv = shlex.split(smoke_run.container_command(pf, rdir, {"PYTHONPATH": overlay}))
    assert argv[:3] == ["/usr/bin/podman", "run", "--rm"]
    assert argv[argv.index("--entrypoint") + 1:argv.index("--entrypoint") + 4] == [run.engine.argv[0], LAB_IMAGE, "-c"]
    assert "--name" not in argv and "-i" in argv and "--pull=never" in argv
    assert ["-v", f"{rdir}:{rdir}:ro"] == argv[argv.index("-i") + 1:argv.index("-i") + 3]    # the release only
    assert f"PYTHONPATH={overlay}" in argv and "PYTHONSAFEPATH=1" in argv
    for o in run.options:              # the unit's mounts, network and IPC, but not its name or --rm
        if o.name in ("-v", "--network", "--ipc", "-e"):
            assert " ".join(o.tokens) in " ".join(argv)


def test_the_baseline_keeps_the_image_and_sees_a_changed_one():
    facts = {"runtime": "podman", "version": "podman version 4.3.1", "image": LAB_IMAGE, "image_id": LAB_ID,
             "digest": LAB_DIGEST}
    b = Baseline(service="s", unit_path="/u", unit_bytes=b"[Service]\n", dropins={}, exec_argv=list(profiles.PODMAN_ARGV),
                 environment={}, sglang={}, served_algorithm=None, declared_algorithm="DFLASH", container=facts)
    back = Baseline.from_json(b.to_json())
    assert back.container == facts and back.container_changes(dict(facts)) == []
    assert back.container_changes({**facts, "digest": "sha256:00"}) == [
        f"image {LAB_IMAGE} digest is sha256:00, baseline {LAB_DIGEST}"]
    raw = json.loads(b.to_json())
    del raw["container"]                               # a baseline recorded before containers deployed
    older = Baseline.from_json(json.dumps(raw))
    assert older.container == {} and older.container_changes(facts) == []


def test_rollback_checks_the_running_container_against_the_baseline():
    b = Baseline(service="s", unit_path="/u", unit_bytes=b"", dropins={}, exec_argv=list(profiles.PODMAN_ARGV),
                 environment={}, sglang={}, served_algorithm=None, declared_algorithm=None,
                 container={"image": LAB_IMAGE, "image_id": LAB_ID, "digest": LAB_DIGEST})
    got = _running()
    assert container_plan.container_problem(b, got) is None
    other = dataclasses.replace(b, container={**b.container, "digest": "sha256:00"})
    assert container_plan.container_problem(other, got) == f"image {LAB_IMAGE} is {LAB_DIGEST}, baseline sha256:00"
    assert got.container is not None
    labelled = dataclasses.replace(got, container=dataclasses.replace(
        got.container, labels={**got.container.labels, "fleetspec.release": "r1"}))
    assert container_plan.container_problem(b, labelled) == "the container sglang still carries release r1"
    assert container_plan.container_problem(b, dataclasses.replace(got, image=None)).startswith(f"image {LAB_IMAGE} is missing")


def test_the_baseline_keeps_a_quadlet_file_and_restores_it_not_the_generated_unit(t, tmp_path):
    from fleetspec.ops.activation import restore_baseline_files
    from fleetspec.ops.rendering import _template

    source = tmp_path / "sglang-qwen.container"
    recorded = b"[Container]\nImage=localhost/sglang-lab:0.5.23\nExec=/opt/v/bin/python3 -m sglang.launch_server\n"
    generated = "/run/systemd/generator/fleetspec-no-such-folder/sglang-qwen.service"   # never written
    b = Baseline(service="sglang-qwen.service", unit_path=generated, unit_bytes=b"[Service]\n", dropins={},
                 exec_argv=list(profiles.PODMAN_ARGV), environment={}, sglang={}, served_algorithm=None,
                 declared_algorithm="DFLASH", sources={str(source): recorded})
    back = Baseline.from_json(b.to_json())
    assert back.sources == {str(source): recorded}
    raw = json.loads(b.to_json())
    raw["sources"][str(source)] = "eA=="
    with pytest.raises(ValueError, match="baseline sources do not match their recorded sha256"):
        Baseline.from_json(json.dumps(raw))
    del raw["sources"], raw["sources_sha256"]                     # a baseline recorded before Quadlet deployed
    assert Baseline.from_json(json.dumps(raw)).sources == {}
    source.write_bytes(recorded + b"PodmanArgs=--edited-by-hand\n")
    source.chmod(0o640)
    restore_baseline_files(t, dataclasses.replace(b, modes={str(source): 0o644}))
    assert source.read_bytes() == recorded and source.stat().st_mode & 0o777 == 0o644
    assert not Path(generated).parent.exists()
    script = _template(ROOT, "rollback.sh.j2").render(
        service="s", release=SimpleNamespace(id="r"), previous_label="baseline", state_dir="/x", dropin_path="/d",
        legacy_dropin_paths=[], previous_dropin=[], previous_dropin_sha256="", previous_current="",
        restore_files=[], remove_files=[], unit_sha256=b.unit_sha256, unit_path=generated,
        sources=[{"path": str(source), "sha256": hashlib.sha256(recorded).hexdigest()}])
    assert f"{hashlib.sha256(recorded).hexdigest()}  {source}" in script


def _inside() -> str:
    """What the lab's pd1 printed for image_python.SNIPPET in a container of its unit's image."""
    return (CAPTURED / "podman-4.3.1-lab-image-python.txt").read_text()


def test_the_images_python_is_read_without_importing_sglang_and_compared_with_the_host():
    from fleetspec.remote.facts import image_python
    from fleetspec.remote.facts.sglang import SglangInstall
    from fleetspec.remote.facts.torch import TorchInfo

    inside = image_python.parse(_inside(), hash_paths=IMAGE_PATHS)
    assert (inside.python, inside.sglang, inside.torch) == ("/opt/sglang/venv/bin/python3", "0.5.23", "2.13.0+cpu")
    assert inside.sglang_path == "/opt/sglang/venv/lib/python3.11/site-packages/sglang"
    site = "/opt/sglang/venv/lib/python3.11/site-packages"
    host = SglangInstall(python="/opt/sglang/venv/bin/python3", python_version="3.11.2", version="0.5.23", site_packages=site)
    torch = TorchInfo(python_tag="cp311", version="2.13.0+cpu", cuda=None, cxx11_abi=True)
    assert container_plan.image_python_problem(inside, host, torch) is None
    older = dataclasses.replace(host, version="0.5.13.post1")
    assert container_plan.image_python_problem(inside, older, torch) == (
        f"the image runs sglang 0.5.23 from {site}/sglang, but the host's /opt/sglang/venv/bin/python3 has "
        f"0.5.13.post1 at {site}/sglang; a release is built for the host's install")
    editable = dataclasses.replace(inside, sglang_path="/sgl-workspace/sglang/python/sglang")   # lmsysorg's images
    assert "from /sgl-workspace/sglang/python/sglang" in container_plan.image_python_problem(editable, host, torch)
    assert container_plan.image_python_problem(inside, host, dataclasses.replace(torch, version="2.11.0+cu130")) == (
        "the image's torch is 2.13.0+cpu, the host's 2.11.0+cu130: kernels are built for the host's torch")
    assert "has no sglang" in container_plan.image_python_problem(dataclasses.replace(inside, sglang=None), host, torch)
    with pytest.raises(ValueError, match="no JSON line"):
        image_python.parse("Error: crun: executable file `/opt/x` not found\n")
    with pytest.raises(ValueError, match="did not check sglang's files"):       # the first line alone
        image_python.parse(_inside().splitlines()[0])


IMAGE_PATHS = ("sglang/srt/server_args.py", "sglang/srt/speculative/ddtree_worker.py")
IMAGE = "localhost/sglang-lab:0.5.23"


def test_the_images_own_sglang_files_are_checked_against_record_and_the_patch_sets_base():
    """pd1's image as built, and a container of it where server_args.py was appended to and a file
    the patch set adds was put in place: the image's own files, not the host's, decide."""
    from fleetspec.model.patchset import PatchFile, PatchSet
    from fleetspec.remote.facts import image_python

    clean = image_python.parse(_inside(), hash_paths=IMAGE_PATHS)
    drifted = image_python.parse((CAPTURED / "podman-4.3.1-lab-image-python-drifted.txt").read_text(),
                                 hash_paths=IMAGE_PATHS)
    n = clean.install.files_checked
    assert clean.install.version == "0.5.23" and n > 5000 and not clean.install.drift and not clean.install.missing
    wheel, edited = clean.install.hashes[IMAGE_PATHS[0]], drifted.install.hashes[IMAGE_PATHS[0]]
    assert wheel and edited and wheel != edited and clean.install.hashes[IMAGE_PATHS[1]] is None
    assert drifted.install.hashes[IMAGE_PATHS[1]] is not None
    assert container_plan.image_files_note(clean) == f"the image's sglang 0.5.23: pristine ({n} files checked against RECORD)"
    assert drifted.install.drift == [IMAGE_PATHS[0]]
    assert container_plan.image_files_note(drifted) == (
        f"the image's sglang 0.5.23: 1 file differs from RECORD ({IMAGE_PATHS[0]})")
    ps = PatchSet(Path("sglang-0.5.23"), "sglang", "0.5.23",
                  (PatchFile(IMAGE_PATHS[0], "replace", "0" * 64, wheel), PatchFile(IMAGE_PATHS[1], "add", "1" * 64)))
    assert container_plan.image_base_problem(IMAGE, clean, ps) is None
    assert container_plan.image_base_problem(IMAGE, clean, None) is None
    assert container_plan.image_base_problem(IMAGE, drifted, ps) == (
        f"{IMAGE_PATHS[0]} in the image {IMAGE} differs from sglang==0.5.23: expected sha256 {wheel}, "
        f"found sha256 {edited}")
    assert container_plan.image_base_problem(IMAGE, drifted, dataclasses.replace(ps, files=ps.files[1:])) == (
        f"{IMAGE_PATHS[1]} exists in the image {IMAGE} but not in sglang==0.5.23; refusing to shadow an unknown file")
    assert container_plan.image_base_problem(IMAGE, clean, dataclasses.replace(ps, version="0.5.13.post1")) == (
        f"patch set sglang-0.5.23 is for sglang==0.5.13.post1; sglang==0.5.23 is installed in the image {IMAGE}")


# Published: github.com/dmitrymailk/hidden_capacity_reasoning sglang.sh ($volume and $model filled with
# the values the script sets; $PWD as /root), as a unit's ExecStart, plus the speculation-only -e the
# operators' NEXTN units carry.
PUBLISHED_DETACHED = ("/usr/bin/docker run -d -ti --rm --gpus all --shm-size 1g -p 1337:30000 "
                      "-v /root/data:/root/.cache/huggingface -v ./:/code -w /code --ipc=host "
                      "-e SGLANG_ENABLE_SPEC_V2=1 lmsysorg/sglang:v0.4.5-cu125 python3 -m sglang.launch_server "
                      "--model-path deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --host 0.0.0.0 --port 30000").split()


def test_a_detached_container_is_refused_and_a_tty_is_stated(tmp_path, t, sshd, ssh_client_key, inventory_writer):
    run = parse_run(PUBLISHED_DETACHED)
    assert container_launch.supervision_problem(run) == (
        "`docker run -d` detaches the container: the runtime client exits at once, so systemd never sees the "
        "engine (a crash would not fail the unit, probes and rollback could not tell); drop -d from the "
        "ExecStart (systemd keeps the container in the foreground)")
    assert container_launch.handling_notes(run) == [
        "runtime option -ti kept as written: the engine gets a pseudo-terminal, its output still reaches the journal"]
    clustered = parse_run([*PUBLISHED_DETACHED[:2], "-dit", *PUBLISHED_DETACHED[4:]])
    assert "`docker run -dit` detaches" in (container_launch.supervision_problem(clustered) or "")
    attached = parse_run([PUBLISHED_DETACHED[0], "run", *PUBLISHED_DETACHED[3:]])
    assert container_launch.supervision_problem(attached) is None
    # Quadlet's own `podman run --sdnotify=conmon -d` (Type=notify: conmon is the supervised pid),
    # as the lab's generator wrote it
    generated = (CAPTURED / "quadlet-5.4.2-lab-generated.service").read_text()
    command = systemd_unit.effective_exec_command(generated, [], unit_context.unit_specifiers("sglang-qwen.service"))
    quadlet = parse_run(list(command.argv), path=command.path)
    assert quadlet.flags_given(*container_launch.DETACH) == ["-d"]
    assert container_launch.supervision_problem(quadlet) is None
    # through preflight's own check, on a real host, before anything is read or changed
    runtime = _stand_in(tmp_path)
    detached = parse_run([str(runtime), "run", "-d", *profiles.PODMAN_ARGV[2:]])
    req = _request(tmp_path, sshd, ssh_client_key, inventory_writer)
    with pytest.raises(UserError, match=r"^h: s.service: `podman run -d` detaches the container"):
        container_plan.deployable(t, req, "s.service", detached, fragment_path="/etc/s.service")


def test_speculation_only_env_of_a_container_is_dropped_from_its_run_and_said_in_the_plan():
    from fleetspec.ops import argv as argv_ops
    from fleetspec.ops.flags import Flags

    run = parse_run([PUBLISHED_DETACHED[0], "run", *PUBLISHED_DETACHED[3:]])
    assert run.env() == {"SGLANG_ENABLE_SPEC_V2": "1"}
    playbook = load_playbook(ROOT / "playbooks" / "ddtree.yaml")
    plan = argv_ops.plan_launch(run.engine, launch.load_table("0.5.23"), Flags(["--speculative-algorithm", "DDTREE"]),
                                playbook, "0.5.23", {n: v or "" for n, v in run.env().items()}, "h: s",
                                env_where="the container's -e")
    assert plan.env_dropped == ("SGLANG_ENABLE_SPEC_V2",)
    assert "speculation-only environment dropped from the container's -e: SGLANG_ENABLE_SPEC_V2" in plan.notes
    argv = container_launch.with_release(run, run.engine.argv, release_id="r1", release_dir="/r/r1",
                                         env={"PYTHONPATH": "/r/r1/overlay"}, drop_env=plan.env_dropped)
    assert "SGLANG_ENABLE_SPEC_V2=1" not in argv
    # every other operator word stays, in its place
    kept = [w for w in run.argv[:run.image_at] if w not in ("-e", "SGLANG_ENABLE_SPEC_V2=1")]
    assert argv[:len(kept)] == kept
    clustered = parse_run([PUBLISHED_DETACHED[0], "run", "-ie", "SGLANG_ENABLE_SPEC_V2=1", *PUBLISHED_DETACHED[-10:]])
    with pytest.raises(LaunchRefused, match="sits in a cluster of short options"):
        container_launch.without_env(clustered, ["SGLANG_ENABLE_SPEC_V2"])


def test_a_draft_model_path_the_container_does_not_have_is_refused(tmp_path):
    """The image python's snippet, run for real by sglang 0.5.23's python, looks for the paths the
    new launch names; one that exists on the host but not in the container is refused in one line."""
    from fleetspec.lab import envs
    from fleetspec.remote.facts import image_python

    present = tmp_path / "models" / "target"
    present.mkdir(parents=True)
    absent = "/models/draft-not-mounted"
    paths = [str(present), absent]
    out = subprocess.run([str(envs.local_env("0.5.23")), "-c", image_python.SNIPPET], capture_output=True, text=True,
                         env={**os.environ, image_python.CHECK_PATHS: json.dumps(paths)}, check=True).stdout
    inside = image_python.parse(out)
    assert inside.missing == (absent,) and inside.sglang == "0.5.23"
    check = {"vars.model_path": str(present), "vars.draft_model_path": absent}
    assert container_plan.model_paths_problem("img:1", check, inside) == (
        f"vars.draft_model_path {absent} is not inside the container (under none of its mounts, not in the image "
        f"img:1), where the engine will open it; mount it in the unit first (`-v {absent}:{absent}:ro`)")
    assert container_plan.model_paths_problem("img:1", {"vars.model_path": str(present)}, inside) is None
    # output captured before the paths were asked for reads as nothing missing
    assert image_python.parse(_inside(), hash_paths=IMAGE_PATHS).missing == ()

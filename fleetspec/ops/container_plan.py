"""A deploy onto a container unit: a `docker run` / `podman run` ExecStart, or the service Podman's
Quadlet generated from a `.container` file (its ExecStart is a `podman run` too). What preflight
checks and records of the container (`deployable`), what status shows of it, and the check that
the running container is the baseline's after a rollback.

Such a unit deploys like a bare one: a drop-in whose ExecStart is container_launch.with_release's
argv, once `deployable` has found the runtime and the image on the host and recorded the image's
id and digest (the baseline keeps them; rollback proves them). On a Quadlet unit the drop-in sits
on the generated service (systemd applies drop-ins to generated units as to any other): the
`.container` file is never written, its bytes are recorded in the baseline and a rollback brings
them back if they changed (docs/guide/containers.md).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fleetspec import systemd_unit, unit_context
from fleetspec.errors import UserError
from fleetspec.model import container_launch, launch
from fleetspec.model.baseline import Baseline
from fleetspec.model.container_launch import RELEASE_LABEL, ContainerRun
from fleetspec.model.patchset import check_base
from fleetspec.remote import facts
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import container_inspect, image_python
from fleetspec.remote.facts.container_inspect import Inspected
from fleetspec.remote.facts.image_python import ImagePython

if TYPE_CHECKING:
    from fleetspec.ops.outcome import DeployRequest


def deployable(t: TransportLike, req: DeployRequest, service: str, run: ContainerRun, *,
               fragment_path: str | None, source_path: str | None = None) -> dict[str, Any]:
    """The container's facts a deploy records (runtime, version, image, image id, digest), or a
    one-line refusal (exit 2, nothing touched): a unit some other generator than Quadlet wrote,
    in-place mode, secret_env, an operator `-e` of a name the release sets, `sglang serve` (the
    smoke tests need the engine's python), an engine python other than vars.python (sglang's
    files, versions and patch-set bases are read with it on the host), no runtime or no image on
    the host (a deploy never pulls), an image ENTRYPOINT in front of the command."""
    host = req.host
    where = f"{host.name}: {service}"
    if unit_context.is_generated(fragment_path) and not (source_path or "").endswith(".container"):
        raise UserError(f"{where}: a generator wrote {fragment_path} from {source_path or 'no SourcePath='}; "
                        "fleetspec deploys onto generated units from a Quadlet .container file only")
    if req.mode == "in-place":
        raise UserError(f"{where}: --mode in-place writes into the host's sglang, not the image's; a container "
                        "unit deploys in release mode (the release folder mounted read-only)")
    if req.playbook.launch.secret_env:
        raise UserError(f"{where}: launch.secret_env of {req.playbook.path.name} is not passed into a container "
                        "yet (its EnvironmentFile= would reach the runtime, not the engine)")
    problem = container_launch.supervision_problem(run)
    if problem:
        raise UserError(f"{where}: {problem}")
    try:
        container_launch.with_release(run, run.engine.argv, release_id="check", release_dir="/check",
                                       env={"PYTHONPATH": ""})
        container_launch.smoke_argv(run, [], [])
    except launch.LaunchRefused as err:
        raise UserError(f"{where}: {err}") from None
    engine_python = run.engine.argv[0]
    if engine_python != host.vars.python:
        raise UserError(f"{where}: the engine runs {engine_python} inside the image, but fleetspec reads sglang's "
                        f"files with vars.python ({host.vars.python}) on the host; a container unit deploys only "
                        f"where that is the image's engine python at the same path (reading sglang inside the "
                        f"image is not built yet)")
    try:
        got: Inspected = facts.gather(t, container_inspect, runtime=run.path, image=run.image, container=None)
    except facts.FactError as err:
        raise UserError(f"{where}: cannot read {run.runtime}'s facts: {str(err).splitlines()[0][:200]}") from None
    return container_facts(where, run, got)


def check_image_python(t: TransportLike, where: str, run: ContainerRun, sglang, torch, patchset=None,
                       model_paths: dict[str, str] | None = None) -> ImagePython:
    """The image's engine python has the sglang (version and place) and torch that preflight read
    on the host with vars.python, and the patch set's base files as its wheel has them, or a
    one-line refusal (exit 2, nothing touched): the release is built for those, its kernels for
    that torch, and it runs over the image's files, not the host's. `model_paths` ({inventory key:
    path}) must be there inside the container too (under its mounts or in the image): a draft model
    found on the host but not mounted would fail the engine at start."""
    paths = tuple(f.path for f in patchset.files) if patchset is not None else ()
    check = {k: p for k, p in (model_paths or {}).items() if p.startswith("/")}
    release = ["--pull=never", *(["-e", f"{image_python.CHECK_PATHS}={json.dumps(sorted(set(check.values())))}"]
                                 if check else [])]
    argv = container_launch.smoke_argv(run, release, ["-c", image_python.SNIPPET])
    try:
        inside: ImagePython = facts.gather(t, image_python, timeout=120, argv=tuple(argv), hash_paths=paths)
    except facts.FactError as err:
        raise UserError(f"{where}: cannot read sglang inside the image {run.image}: "
                        f"{str(err).splitlines()[0][:200]}") from None
    problem = image_python_problem(inside, sglang, torch)
    if problem:
        raise UserError(f"{where}: {problem}")
    problem = image_base_problem(run.image, inside, patchset)
    if problem:
        raise UserError(f"{where}: {problem}")
    problem = model_paths_problem(run.image, check, inside)
    if problem:
        raise UserError(f"{where}: {problem}")
    return inside


def model_paths_problem(image: str, check: dict[str, str], inside: ImagePython) -> str | None:
    """The first model path the new launch names that the container does not have (pure)."""
    for key, path in check.items():
        if path in inside.missing:
            return (f"{key} {path} is not inside the container (under none of its mounts, not in the image "
                    f"{image}), where the engine will open it; mount it in the unit first (`-v {path}:{path}:ro`)")
    return None


def image_base_problem(image: str, inside: ImagePython, patchset) -> str | None:
    """The patch set's base check on the image's own files, as preflight does it on the host (pure)."""
    if patchset is None:
        return None
    have = {p: h for p, h in (inside.install.hashes or {}).items() if h is not None}
    try:
        check_base(patchset, inside.install.version or "", have, where=f"in the image {image}")
    except UserError as err:
        return str(err)
    return None


def image_files_note(inside: ImagePython) -> str:
    """The image's sglang files against its RECORD, as status says it for a host (pure)."""
    install = inside.install
    changed = [*install.drift, *install.missing]
    if not changed:
        return f"the image's sglang {install.version}: pristine ({install.files_checked} files checked against RECORD)"
    n = len(changed)
    return (f"the image's sglang {install.version}: {n} file{'s' if n != 1 else ''} "
            f"differ{'' if n != 1 else 's'} from RECORD "
            f"({', '.join(changed[:3])}{', …' if len(changed) > 3 else ''})")


def image_python_problem(inside: ImagePython, sglang, torch) -> str | None:
    """What differs between the image's python and the host's reading of vars.python (pure)."""
    host_place = f"{sglang.site_packages}/sglang" if sglang.site_packages else None
    if inside.sglang is None:
        return f"the image's {inside.python} has no sglang (the host's {sglang.python} has {sglang.version})"
    if inside.sglang != sglang.version or (host_place and inside.sglang_path != host_place):
        return (f"the image runs sglang {inside.sglang} from {inside.sglang_path}, but the host's {sglang.python} "
                f"has {sglang.version} at {host_place}; a release is built for the host's install")
    host_torch = getattr(torch, "version", None)
    if host_torch and inside.torch != host_torch:
        return (f"the image's torch is {inside.torch}, the host's {host_torch}: kernels are built for the "
                f"host's torch")
    return None


def container_facts(where: str, run: ContainerRun, got: Inspected) -> dict[str, Any]:
    """What the baseline records of the runtime and image, or the refusal (pure)."""
    if got.version is None:
        raise UserError(f"{where}: {run.runtime} not found on the host ({run.path})")
    image = got.image
    if image is None:
        raise UserError(f"{where}: image {run.image} is not on the host; a deploy never pulls (pull it, then deploy)")
    if image.entrypoint and run.needs_image_entrypoint:
        raise UserError(f"{where}: the image {run.image} has ENTRYPOINT {list(image.entrypoint)} in front of the "
                        f"engine command, which fleetspec cannot see through; {container_launch.ADVICE}")
    return {"runtime": run.runtime, "version": got.version, "image": run.image, "image_id": image.id,
            "digest": image_digest(image)}


def image_digest(image) -> str | None:
    """podman's Digest, else docker's first RepoDigest's."""
    return image.digest or (image.repo_digests[0].rpartition("@")[2] if image.repo_digests else None)


def container_status(t: TransportLike, files: Any, service: str) -> dict[str, Any] | None:
    """status's `container` field for a `docker run`/`podman run` unit, Quadlet's included (None
    for any other): the runtime, image, its id and digest, the container's state and restarts;
    one more command."""
    from fleetspec.ops.hoststate import is_ours

    if getattr(files, "unit_bytes", None) is None:
        return None
    texts = [b.decode(errors="replace") for p, b in files.dropins.items() if not is_ours(p)]
    try:
        command = systemd_unit.effective_exec_command(files.unit_bytes.decode(errors="replace"), texts,
                                                       unit_context.unit_specifiers(service))
        if container_launch.runtime_of(command.path) is None:
            return None
        run = container_launch.parse_run(list(command.argv), path=command.path, prefix=command.flags)
    except (ValueError, launch.LaunchRefused):
        return None
    name = next((v for v in run.option("--name") if v), None)
    try:
        got: Inspected = facts.gather(t, container_inspect, runtime=run.path, image=run.image, container=name)
    except facts.FactError as err:
        return {"runtime": run.runtime, "image": run.image, "error": str(err).splitlines()[0][:200]}
    image, c = got.image, got.container
    return {"runtime": run.runtime, "version": got.version, "image": run.image,
            "image_id": image.id if image else None,
            "digest": image_digest(image) if image else None,
            "container": c.name if c else name, "state": c.status if c else None,
            "restarts": c.restart_count if c else None, "health": c.health if c else None,
            "release_label": c.labels.get("fleetspec.release") if c else None}


def status_line(c: dict[str, Any]) -> str:
    """status's note for a container unit, in one line."""
    if c.get("error"):
        return f"container: {c['runtime']} {c['image']}: {c['error']}"
    digest = c.get("digest") or "no digest"
    state = f"{c['container']} {c['state']}, restarts {c['restarts']}" if c.get("state") else \
        f"{c.get('container') or 'unnamed'}: no such container"
    health = f", health {c['health']}" if c.get("health") else ""
    release = f"; label fleetspec.release={c['release_label']}" if c.get("release_label") else ""
    return f"container: {c['runtime']} {c['image']} ({digest}); {state}{health}{release}"


def running_container(t: TransportLike, baseline: Baseline) -> Inspected:
    """The baseline unit's runtime, image and container as the host has them now."""
    run = container_launch.parse_run(baseline.exec_argv)
    name = next((v for v in run.option("--name") if v), None)
    return facts.gather(t, container_inspect, runtime=run.path, image=run.image, container=name)


def container_problem(baseline: Baseline, got: Inspected) -> str | None:
    """The running container is not the baseline's (pure): another image id or digest, or it still
    carries a release's label. None when it is."""
    want = baseline.container
    if got.image is None or image_digest(got.image) != want.get("digest") or got.image.id != want.get("image_id"):
        return (f"image {want.get('image')} is {image_digest(got.image) if got.image else 'missing'}, "
                f"baseline {want.get('digest')}")
    c = got.container
    if c is not None:
        if c.image_id != want.get("image_id"):
            return f"the container {c.name} runs image {c.image_id[:19]}, baseline {str(want.get('image_id'))[:19]}"
        label = c.labels.get(RELEASE_LABEL)
        if label:
            return f"the container {c.name} still carries release {label}"
    return None

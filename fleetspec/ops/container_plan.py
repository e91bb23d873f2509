"""A deploy onto a `docker run` / `podman run` unit: what preflight checks and records of the
container (`deployable`), and the plan of the forms still refused.

A `docker run`/`podman run` ExecStart deploys like a bare unit (a drop-in whose ExecStart is
container_launch.with_release's argv), once `deployable` has found the runtime and the image on
the host and recorded the image's id and digest (the baseline keeps them; rollback proves them).
A unit generated from a Quadlet `.container` file is still planned only: `deploy --plan` shows what
the deploy would run (`planned`: the runtime and image as the host has them, the runtime words kept,
the engine command derived as for bare metal, the ExecStart diff) and a deploy is refused before
anything is touched (docs/containers.md). There the sglang version inside the image picks the
parser table: the inventory's `extra.sglang_version`; without it the engine command is not derived.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from fleetspec import systemd_unit
from fleetspec.errors import UserError
from fleetspec.model import container_launch, launch
from fleetspec.model.baseline import Baseline
from fleetspec.model.container_launch import RELEASE_LABEL, ContainerRun
from fleetspec.model.release import BASELINE
from fleetspec.ops import argv as argv_ops
from fleetspec.ops.flags import render_flags
from fleetspec.ops.options import resolve_options
from fleetspec.ops.planning import Plan
from fleetspec.remote import facts
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import container_inspect
from fleetspec.remote.facts.container_inspect import Inspected

if TYPE_CHECKING:
    from fleetspec.ops.outcome import DeployRequest


GENERATED_UNITS = ("/run/systemd/generator", "/run/systemd/generator.late", "/usr/lib/systemd/generator")


def is_generated(fragment_path: str | None) -> bool:
    """A unit a generator wrote (Podman's Quadlet writes the `.service` of a `.container` file there):
    a drop-in would work, but the operator edits the Quadlet file, not the unit."""
    return any((fragment_path or "").startswith(d + "/") for d in GENERATED_UNITS)


def deployable(t: TransportLike, req: DeployRequest, service: str, run: ContainerRun, *,
               fragment_path: str | None) -> dict[str, Any]:
    """The container's facts a deploy records (runtime, version, image, image id, digest), or a
    one-line refusal (exit 2, nothing touched): a Quadlet unit (ContainerPlanned), in-place mode,
    secret_env, an operator `-e` of a name the release sets, `sglang serve` (the smoke tests need
    the engine's python), an engine python other than vars.python (sglang's files, versions and
    patch-set bases are read with it on the host), no runtime or no image on the host (a deploy
    never pulls), an image ENTRYPOINT in front of the command."""
    host = req.host
    where = f"{host.name}: {service}"
    if is_generated(fragment_path):
        raise ContainerPlanned(f"{where} (generated at {fragment_path}, a Quadlet unit)", run,
                               build_plan(req, service, run, None))
    if req.mode == "in-place":
        raise UserError(f"{where}: --mode in-place writes into the host's sglang, not the image's; a container "
                        "unit deploys in release mode (the release folder mounted read-only)")
    if req.playbook.launch.secret_env:
        raise UserError(f"{where}: launch.secret_env of {req.playbook.path.name} is not passed into a container "
                        "yet (its EnvironmentFile= would reach the runtime, not the engine)")
    try:
        container_launch.with_release(run, run.engine.argv, release_id="check", root="/", env={"PYTHONPATH": ""})
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


class ContainerPlanned(UserError):
    """A container service: refused as a deploy (exit 2, nothing touched); `plan` is what --plan shows."""

    def __init__(self, where: str, run: ContainerRun, plan: Plan):
        self.run, self.plan = run, plan
        super().__init__(f"{where}: deploys onto Quadlet units are planned only ({run.label}); `fleetspec deploy "
                         f"{plan.host} --algo {plan.algo} --plan` shows what the deploy would run")


def planned(t: TransportLike, req: DeployRequest, service: str, run: ContainerRun) -> ContainerPlanned:
    """Read the container's facts and derive its engine command; the refusal carrying the plan."""
    host = req.host
    name = next((v for v in run.option("--name") if v), None)
    try:
        got: Inspected | None = facts.gather(t, container_inspect, runtime=run.path, image=run.image, container=name)
    except facts.FactError:
        got = None
    return ContainerPlanned(f"{host.name}: {service}", run, build_plan(req, service, run, got))


def build_plan(req: DeployRequest, service: str, run: ContainerRun, got: Inspected | None) -> Plan:
    """The plan from the parsed unit and the host's facts (pure)."""
    host, playbook = req.host, req.playbook
    version = host.vars.extra.get("sglang_version")
    notes = [f"{host.name}: {n}" for n in fact_notes(run, got)]
    launch_info: dict[str, Any] | None = None
    new_argv = list(run.argv)
    table = launch.load_table(str(version)) if version else None
    if table is None:
        notes.append(f"{host.name}: engine command not derived: " + (
            f"fleetspec has no parser table for sglang {version}" if version else
            "the sglang version inside the image is not known here (set extra.sglang_version in the inventory)"))
    else:
        options = resolve_options(playbook, req.options, host.is_hybrid_tagged)
        flags = render_flags(playbook, host.vars.template_view(), options.values)
        where = f"{host.name}: {service}"
        planned = argv_ops.plan_launch(run.engine, table, flags, playbook, str(version), {}, where)  # as bare metal
        try:
            new_argv = container_launch.host_argv(run, planned.derived.argv)
        except launch.LaunchRefused as err:
            raise UserError(f"{where}: {err}") from None
        notes += [f"{host.name}: {n}" for n in planned.notes]
        spec_env = launch.speculative_env([(v or "").partition("=")[0] for v in run.option("-e", "--env")])
        if spec_env:
            notes.append(f"{host.name}: speculation-only variables given with -e/--env stay as written (runtime "
                         f"options are kept byte for byte): {', '.join(spec_env)}")
        launch_info = {**planned.to_dict(), "form": run.label, "runtime_words": run.head}
    old_shown, new_shown = shown(run, run.argv), shown(run, new_argv)
    diff = "".join(difflib.unified_diff([a + "\n" for a in old_shown], [a + "\n" for a in new_shown],
                                        f"{service} ExecStart (now)", f"{service} ExecStart (after)", n=2))
    dropin = ("# planned only: fleetspec does not deploy onto Quadlet units yet\n[Service]\nExecStart=\n"
              f"ExecStart={systemd_unit.exec_line(new_shown, run.prefix, run.path if '@' in run.prefix else None)}\n")
    return Plan(host=host.name, service=service, sglang=str(version) if version else "unknown (inside the image)",
                algo=playbook.algo, expected_algorithm=playbook.speculative_algorithm, previous=BASELINE,
                execstart_diff=diff, dropin=dropin, notes=notes, options=dict(playbook.options),
                launch=launch_info, steps=["preflight", "planned only (Quadlet units are refused)"])


ENV_OPTIONS = ("-e", "--env")


def shown(run: ContainerRun, argv: list[str] | tuple[str, ...]) -> list[str]:
    """argv for the terminal: the value of a secret-looking `-e NAME=VALUE` replaced (model.baseline.is_secret)."""
    from fleetspec.model.baseline import is_secret

    out = list(argv)
    i = 1
    for opt in [*run.main_options, *run.options]:
        while i < run.image_at and out[i] != opt.tokens[0]:
            i += 1
        if opt.name in ENV_OPTIONS or (opt.name[:1] == "-" and opt.name[1:2] != "-" and opt.name.endswith("e")):
            name, eq, value = (opt.value or "").partition("=")
            if eq and value and is_secret(name, value):
                at = i + len(opt.tokens) - 1
                out[at] = out[at][:len(out[at]) - len(value)] + "<redacted>"
        i += len(opt.tokens)
    return out


def fact_notes(run: ContainerRun, got: Inspected | None) -> list[str]:
    """What the plan says about the runtime, the image and the container (no values of -e/--env)."""
    kept = " ".join(o.name for o in run.options)
    out = [f"container: {run.runtime} run, image {run.image}; runtime options kept byte for byte: {kept or '-'}"]
    if got is None or got.version is None:
        out.append(f"{run.runtime}: not found on the host ({run.path})")
        return out
    out.append(f"runtime: {got.version}")
    image = got.image
    if image is None:
        out.append(f"image {run.image}: not on the host (a deploy never pulls)")
    else:
        digest = image.digest or (image.repo_digests[0].rpartition('@')[2] if image.repo_digests else "none")
        out.append(f"image {run.image}: id {image.id.removeprefix('sha256:')[:12]}, digest {digest}")
        if image.entrypoint and run.needs_image_entrypoint:
            out.append(f"the image's ENTRYPOINT {list(image.entrypoint)} runs in front of the command: fleetspec "
                       f"cannot vouch for how it passes the arguments on")
    c = got.container
    if c is None:
        out.append("container: none by that name now" if next(iter(run.option("--name")), None)
                   else "container: unnamed (no --name), not looked up")
    else:
        health = f", health {c.health}" if c.health else ""
        out.append(f"container {c.name}: {c.status}, restarts {c.restart_count}{health}")
    return out


def container_status(t: TransportLike, files: Any) -> dict[str, Any] | None:
    """status's `container` field for a `docker run`/`podman run` unit (None for any other): the
    runtime, image, its id and digest, the container's state and restarts; one more command."""
    from fleetspec import systemd_unit
    from fleetspec.ops.hoststate import is_ours

    if getattr(files, "unit_bytes", None) is None:
        return None
    texts = [b.decode(errors="replace") for p, b in files.dropins.items() if not is_ours(p)]
    try:
        command = systemd_unit.effective_exec_command(files.unit_bytes.decode(errors="replace"), texts)
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
            "digest": (image.digest or (image.repo_digests[0].rpartition("@")[2] if image.repo_digests else None))
            if image else None,
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
    return f"container: {c['runtime']} {c['image']} ({digest}); {state}{health}"


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

"""`fleetspec render`: the launch a deploy would derive, without a host (pure but for reading files).

The source is a systemd unit file (a `docker run`/`podman run` unit too), a Quadlet `.container`
file, a compose file's service, a bare argv, or a LeaderWorkerSet manifest; the sglang version is
the operator's (`--sglang`: the packaged parser table of that version splits the argv). What
preflight reads on a host is given here: `--var NAME=VALUE` for the playbook's `{{ host.* }}`
(draft_model_path), `--hybrid` for a hybrid target. The derivation is preflight's own:
`options.resolve_options`, `flags.render_flags`, `argv.plan_launch`, and its refusals are the
same one-line UserErrors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fleetspec import systemd_unit
from fleetspec.errors import UserError
from fleetspec.model import container_compose, container_quadlet, k8s_lws, launch, option_table
from fleetspec.model.container_launch import ContainerRun
from fleetspec.model.launch import LaunchForm, LaunchRefused
from fleetspec.model.playbook import Playbook
from fleetspec.ops import argv as argv_ops
from fleetspec.ops.flags import render_flags
from fleetspec.ops.options import resolve_options


@dataclass(frozen=True)
class Target:
    """What a host would tell preflight, given by the operator."""

    version: str
    host_vars: Mapping[str, Any] = field(default_factory=dict)
    hybrid: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)
    gpu_mem: float | None = None          # the smallest GPU's memory, MiB (cuda graph sizing)


@dataclass(frozen=True)
class Rendered:
    source: str
    form: str
    argv: list[str]
    env_set: dict[str, str]
    env_unset: tuple[str, ...]
    notes: tuple[str, ...]
    plan: argv_ops.LaunchPlan

    def to_json(self) -> dict:
        return {"source": self.source, "form": self.form, "argv": self.argv, "env_set": self.env_set,
                "env_unset": list(self.env_unset), "notes": list(self.notes), "launch": self.plan.to_dict()}


def table_for(version: str) -> launch.OptionTable:
    table = option_table.load_table(version)
    if table is None:
        raise UserError(f"--sglang {version}: no packaged parser table for that version (known: "
                        f"{', '.join(option_table.known_versions())}); render reads no host")
    return table


def derive(form: LaunchForm, environment: Mapping[str, str], playbook: Playbook, target: Target,
           where: str) -> Rendered:
    """The derived launch for one classified command, as preflight plans it."""
    options = resolve_options(playbook, target.overrides, target.hybrid)
    model = _value(form.args, "--model-path")
    flags = render_flags(playbook, {"model_path": model, **target.host_vars}, options.values)
    plan = argv_ops.plan_launch(form, table_for(target.version), flags, playbook, target.version,
                                dict(environment), where, target.gpu_mem)
    notes = [*options.notes, *plan.notes]
    if playbook.patchset_for(target.version):
        notes.append(f"the release (patch set for sglang {target.version}) goes first on PYTHONPATH")
    return Rendered(where, form.label, plan.derived.argv, dict(playbook.launch.env), plan.env_dropped,
                    tuple(notes), plan)


def _value(args: list[str], name: str) -> str | None:
    for i, word in enumerate(args):
        if word == name and i + 1 < len(args):
            return args[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _refused(where: str, err: LaunchRefused) -> UserError:
    return UserError(f"{where}: the command is {err.form}: {err.why}")


def from_file(path: Path, playbook: Playbook, target: Target, service: str | None = None) -> Rendered:
    """A unit file, a Quadlet .container file or a compose file (by its content)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read it: {getattr(err, 'strerror', None) or err}") from None
    where = str(path)
    if path.suffix == ".container":
        try:
            q = container_quadlet.parse_quadlet(text)
        except LaunchRefused as err:
            raise UserError(f"{where}: {err}") from None
        return derive(q.engine, {}, playbook, target, where)
    if "[Service]" in text:
        try:
            command = systemd_unit.effective_exec_command(text)
        except systemd_unit.NeedsHostEnvironment:
            raise UserError(f"{where}: ExecStart= uses $VARIABLES, whose values are on the host (EnvironmentFile=); "
                            f"render the expanded command as an argv, or use deploy --plan") from None
        except ValueError as err:
            raise UserError(f"{where}: cannot read ExecStart: {err}") from None
        form = argv_ops.classify_or_refuse(command, where)
        if isinstance(form, ContainerRun):
            return derive(form.engine, {}, playbook, target, where)
        return derive(form, systemd_unit.effective_environment(text), playbook, target, where)
    try:
        svc = container_compose.parse_compose(text, service)
    except LaunchRefused as err:
        raise UserError(f"{where}: {err}") from None
    return derive(svc.engine, {}, playbook, target, f"{where}: service {svc.name}")


def from_argv(argv: list[str], playbook: Playbook, target: Target) -> Rendered:
    try:
        form = launch.classify(argv)
    except LaunchRefused as err:
        raise _refused("argv", err) from None
    return derive(form, {}, playbook, target, "argv")


def lws(path: Path, playbook: Playbook, target: Target, release_image: str | None) -> tuple[str, list[Rendered]]:
    """The manifest with each pod template's sglang container patched, and each derivation."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read it: {getattr(err, 'strerror', None) or err}") from None
    needs_release = bool(playbook.patchset_for(target.version) or playbook.kernels)
    if needs_release and not release_image:
        raise UserError(f"--release-image REF is required: {playbook.algo}'s release (its patch set for sglang "
                        f"{target.version}) must reach the pods (docs/kubernetes.md: the release image)")
    if release_image:
        _check_image(release_image)
    changes, rendered = [], []
    for group in k8s_lws.containers(text, str(path)):
        c = _sglang_container(group)
        env = {str(e.get("name")): str(e.get("value", "")) for e in c.env if isinstance(e, dict)}
        try:
            form = launch.classify(c.argv)
        except LaunchRefused as err:
            raise _refused(c.where, err) from None
        r = derive(form, env, playbook, target, c.where)
        rendered.append(r)
        changes.append(k8s_lws.Change(c, r.argv, r.env_set, r.env_unset,
                                      release_image if needs_release else None))
    return k8s_lws.patch(text, str(path), changes), rendered


def _sglang_container(group: list[k8s_lws.Container]) -> k8s_lws.Container:
    """The one container of a pod template that runs sglang; the sglang one's refusal otherwise."""
    found, refusals = [], []
    for c in group:
        if not c.data.get("command"):
            if "sglang" in " ".join(c.argv + [str(c.data.get("image", ""))]):
                refusals.append(UserError(f"{c.where}: no command: the image's entrypoint runs the engine, so "
                                          f"fleetspec cannot see or replace its flags; give the container its command"))
            continue
        try:
            launch.classify(c.argv)
            found.append(c)
        except LaunchRefused as err:
            if "sglang" in " ".join(c.argv):
                refusals.append(_refused(c.where, err))
    if len(found) == 1:
        return found[0]
    if found:
        raise UserError(f"{found[0].where}: several containers run sglang in one pod template")
    if refusals:
        raise refusals[0]
    where = group[0].where.rsplit(" container ", 1)[0] if group else "a pod template"
    raise UserError(f"{where}: no container runs sglang (python -m sglang.launch_server or sglang serve)")


def _check_image(ref: str) -> None:
    """A versioned release image: a digest, or a tag other than latest (a rollback re-applies the
    previous manifest, which must name the previous release exactly)."""
    name, _, digest = ref.partition("@")
    tag = name.rsplit("/", 1)[-1].partition(":")[2]
    if not digest and (not tag or tag == "latest"):
        raise UserError(f"--release-image {ref}: name a version (NAME:TAG other than latest, or NAME@sha256:…); "
                        f"re-applying the previous manifest must bring back the previous release exactly")

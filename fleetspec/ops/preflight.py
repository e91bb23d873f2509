"""Preflight: read everything about a host that a deploy depends on, and refuse before touching it.

Read-only. One batched round trip gathers the facts; then the checks run in order, each a
one-line refusal naming the host and what was expected: service found and healthy, no
interrupted deploy left switched, sglang version has a patch set and its base files are pristine,
kernels' ABI matches, hybrid guard, disk, model paths. The checks live in ops/preflight_checks.py,
the choice of patch set and kernels in ops/selection.py, the secrets in ops/redaction.py; what it
returns is ops/preflight_result.Preflight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from fleetspec.errors import UserError
from fleetspec.model import container_launch
from fleetspec.model import ledger as L
from fleetspec.model.container_launch import ContainerRun
from fleetspec.model.inventory import Host
from fleetspec.model.launch import LaunchForm
from fleetspec.model.layout import HostLayout, local_mirror
from fleetspec.model.playbook import Playbook
from fleetspec.ops import argv as argv_ops
from fleetspec.ops import container_plan, execstart, probes, serving
from fleetspec.ops.flags import render_flags
from fleetspec.ops.gpu_checks import check_gpu_health
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.options import ResolvedOptions, resolve_options
from fleetspec.ops.preflight_checks import (
    _model_path,
    admin_exec_start_dropins,
    check_disk,
    check_dropin_order,
    check_gpus,
    check_interrupted,
    check_loaded,
    check_orphan_dropin,
    check_paths,
    check_templates,
    check_unit_drift,
    holder_first,
    model_paths,
    read_unit_files,
)
from fleetspec.ops.preflight_result import Preflight
from fleetspec.ops.redaction import check_secret_env, secret_refs
from fleetspec.ops.selection import candidate_paths, kernel_facts, load_kernels, preload_patchsets, select_patchset
from fleetspec.remote import facts
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import FactError, file_text, missing_paths
from fleetspec.remote.facts import disk as disk_fact
from fleetspec.remote.facts import env_files as env_files_fact
from fleetspec.remote.facts import gpu as gpu_fact
from fleetspec.remote.facts import gpu_health as gpu_health_fact
from fleetspec.remote.facts import model_config as model_fact
from fleetspec.remote.facts import sglang as sglang_fact
from fleetspec.remote.facts import systemd as systemd_fact
from fleetspec.remote.facts import torch as torch_fact
from fleetspec.remote.facts import unit_age as unit_age_fact
from fleetspec.remote.facts import unit_files as unit_files_fact
from fleetspec.remote.facts.execenv import HostEnv
from fleetspec.remote.facts.gpu_health import GpuHealth
from fleetspec.remote.facts.systemd import SystemdUnit
from fleetspec.remote.option_table import option_table

if TYPE_CHECKING:
    from fleetspec.ops.outcome import DeployRequest


def run(t: TransportLike, req: DeployRequest, echo: Callable[[str], None] = print,
        progress: Callable[[str | None], None] = lambda _: None, wait_serving: bool = True) -> Preflight:
    """Read the host and refuse bad input (exit 2) or a host that needs an operator (exit 3).
    An engine still loading is waited for (`wait_serving`; else noted): serving.require_serving."""
    host, playbook = req.host, req.playbook
    check_secret_env(host, playbook)           # before the host is even contacted
    t.check_access()                           # become: sudo that cannot act as root: one line, exit 2
    loaded = preload_patchsets(playbook)
    got = gather_host(t, host, candidate_paths(loaded), keep=not req.plan_only)
    svc = read_service(t, host, playbook, req.root, got)
    for k in ("sglang", "torch"):             # the host's python is one others could change: refused, said why
        if isinstance(got[k], FactError) and "runs as root, but" in str(got[k]):
            raise UserError(f"{got[k]} (vars.python in {host.inventory_path})")
    run = svc.form if isinstance(svc.form, ContainerRun) else None
    form = svc.form.engine if isinstance(svc.form, ContainerRun) else svc.form     # the engine command
    container = None if run is None else container_plan.deployable(
        t, req, svc.service, run, fragment_path=svc.unit.fragment_path, source_path=svc.unit.source_path)
    waited = serving.require_serving(t, host, svc.unit, _or_none(got["age"]), probes.spec_for_host(host, None, playbook.probes),
                                     allow_unhealthy=req.allow_unhealthy, wait=wait_serving and not req.plan_only,
                                     progress=progress)
    sg, tv, disk, model, gpus = (_or_none(got[k]) for k in ("sglang", "torch", "disk", "model", "gpus"))
    path = _model_path(host, svc.exec_argv)
    if path != _model_path(host, []):          # ExecStart names another model than the inventory
        model = facts.gather_many(t, [(model_fact, {"path": path})])[0]
    if sg is None or not getattr(sg, "version", None):
        raise UserError(f"{host.name}: no sglang found for python {host.vars.python} "
                        f"(vars.python in {host.inventory_path})")
    hybrid = bool(getattr(model, "is_hybrid", False)) or host.is_hybrid_tagged
    options = resolve_options(playbook, req.options, hybrid)
    notes = [waited] if waited else []
    notes.extend(f"{host.name}: {n}" for n in [*svc.notes, *options.notes])
    notes.extend(f"{host.name}: the admin drop-in {p} sets ExecStart=; fleetspec's drop-in (applied after it) "
                 f"replaces that command, and rollback puts it back" for p in svc.overriding)
    launch = _plan_launch(t, host, playbook, svc, sg.version, options, _smallest_gpu(gpus))
    notes.extend(f"{host.name}: {n}" for n in launch.notes)
    patchset = select_patchset(t, playbook, sg, host.name, loaded)
    notes.extend(_check_container(t, host, svc, run, container, sg, tv, patchset))
    kernels = load_kernels(playbook, kernel_facts(tv, gpus), host.name)
    check_disk(host, disk, patchset, kernels)
    check_paths(t, host, playbook, _raised(got["missing"]))
    notes.extend(check_gpus(host, gpus))
    health = got["gpu_health"] if gpus is not None and gpus.present else None
    notes.extend(check_gpu_health(host, playbook, health, launch.gpus, getattr(tv, "cuda", None)))
    ahead = L.parse(_raised(got["ledger"]) or "").staged_ahead(playbook.algo)
    pf = Preflight(host=host, root=req.root, playbook=playbook, service=svc.service, python=host.vars.python,
                   unit=svc.unit, unit_bytes=svc.unit_bytes, dropins=svc.dropins, exec_argv=svc.exec_argv,
                   sglang=sg, torch=tv, hybrid=hybrid, options=options, new_argv=launch.derived.argv,
                   patchset=patchset, kernels=kernels, notes=notes, guard=playbook.guard,
                   form=form,
                   launch=launch, gpu_health=health if isinstance(health, GpuHealth) else None,
                   container=run, container_facts=container,
                   keep_releases=int(host.vars.extra.get("keep_releases", playbook.keep_releases)),
                   staged_ahead=ahead[-1] if ahead else None, staged_ahead_older=tuple(ahead[:-1]))
    check_templates(pf)
    for note in notes:
        echo(note)
    return pf


def _check_container(t: TransportLike, host: Host, svc: "ServiceRead", run: ContainerRun | None,
                     container: dict | None, sg, tv, patchset) -> list[str]:
    """A container unit: its image's python has the sglang and torch read on the host, and the
    patch set's base files inside the image (else a one-line refusal); the notes that name the
    runtime, image, the options kept and the image's sglang files against RECORD."""
    if run is None or container is None:
        return []
    paths = {"vars.model_path": host.vars.model_path, "vars.draft_model_path": host.vars.draft_model_path}
    inside = container_plan.check_image_python(t, f"{host.name}: {svc.service}", run, sg, tv, patchset,
                                               {k: v for k, v in paths.items() if v})
    return [f"{host.name}: container: {run.runtime} run {run.image} (image {container['image_id'][:12]}, "
            f"digest {container['digest'] or 'none'}; {container['version']}); runtime options kept byte "
            f"for byte: {' '.join(o.name for o in run.options) or '-'}",
            f"{host.name}: container: {container_plan.image_files_note(inside)}",
            *(f"{host.name}: container: {note}" for note in container_launch.handling_notes(run))]


@dataclass
class ServiceRead:
    """The service as preflight found it: systemd's view, the unit files, the operator's ExecStart."""
    service: str
    unit: SystemdUnit
    unit_bytes: bytes
    dropins: dict[str, bytes]
    dropin_texts: list[str]
    exec_argv: list[str]
    form: LaunchForm | ContainerRun
    overriding: list[str]
    notes: list[str] = field(default_factory=list)
    env: HostEnv | None = None       # what the process's environment comes from (EnvironmentFile=, manager)


def gather_host(t: TransportLike, host: Host, hash_paths: tuple[str, ...] = (), keep: bool = False) -> dict:
    """Every fact preflight reads, in one round trip (status's batching, facts.gather_many); a
    failed fact is its FactError, raised or read as None where the check that needs it runs.
    The model's config is read at the inventory's model_path; read_service's ExecStart may name
    another, read again then. `hash_paths`: every patch-set path the playbook could need, hashed
    by the sglang fact (the version that picks the patch set is not known before the batch).
    `keep`: the facts may keep their caches on the host (a deploy); --plan writes nothing there."""
    service, python = host.vars.service, host.vars.python
    layout = HostLayout(service)
    return facts.gather_many(t, {
        "unit": (systemd_fact, {"service": service}),
        "files": (unit_files_fact, {"service": service}),
        "ledger": (file_text, {"path": str(layout.ledger)}),
        "sglang": (sglang_fact, {"python": python, "hash_paths": tuple(hash_paths), "keep": keep}),
        "torch": (torch_fact, {"python": python, "keep": keep}),
        "disk": (disk_fact, {"path": str(layout.root)}),
        "model": (model_fact, {"path": _model_path(host, [])}),
        "gpus": (gpu_fact, {}),
        "gpu_health": (gpu_health_fact, {"service": service}),
        "missing": (missing_paths, {"paths": tuple(model_paths(host))}),
        "age": (unit_age_fact, {"service": service}),
        "env": (env_files_fact, {"patterns": ()}),         # the manager's environment
    }, errors="return")


def _raised(value):
    if isinstance(value, FactError):
        raise value
    return value


def _or_none(value):
    return None if isinstance(value, FactError) else value


def read_service(t: TransportLike, host: Host, playbook: Playbook, root: Path, got: dict | None = None) -> ServiceRead:
    """The unit, its files and ExecStart, refusing a missing, hand-edited, orphaned, interrupted or
    stopped service before anything is locked or written (a host a live holder is changing: the
    lock's refusal, see holder_first). `got`: gather_host's facts (else read)."""
    service = host.vars.service
    state = HostState(t, host.name, service)
    got = gather_host(t, host) if got is None else got
    unit, files_fact = _raised(got["unit"]), _raised(got["files"])
    if unit.load_state != "loaded" or not unit.fragment_path:
        raise UserError(f"{host.name}: service {service} not found (LoadState={unit.load_state}); "
                        f"check vars.service in {host.inventory_path}")
    with holder_first(t, str(state.layout.lock)):
        unit_bytes, dropins, dropin_texts = read_unit_files(t, unit, files_fact)
        check_orphan_dropin(state, unit, host, files_fact.baseline_json)
        try:
            env = execstart.host_environment(t, unit_bytes, dropin_texts, service, _or_none(got.get("env")))
            command = execstart.exec_command(t, unit_bytes, dropin_texts, service, env)
        except ValueError as err:
            raise UserError(f"{host.name}: cannot read ExecStart of {service} from {unit.fragment_path}: {err}") from None
        notes = execstart.check_variables(command, host, playbook, f"{host.name}: {service}")
        form = argv_ops.classify_or_refuse(command, f"{host.name}: {service}")
        check_dropin_order(unit, host, service)
        overriding = admin_exec_start_dropins(unit, dropin_texts)
        check_interrupted(state, host.name, L.parse(_raised(got["ledger"]) or ""))
        check_loaded(unit, host, service)
        mirrored = HostState(t, host.name, service, mirror=local_mirror(root, host, service))
        check_unit_drift(mirrored, host.name, service, unit_bytes, dropins, secret_refs(host, playbook),
                         baseline_text=files_fact.baseline_json)
    return ServiceRead(service, unit, unit_bytes, dropins, dropin_texts, list(command.argv), form, overriding, notes,
                       env)


def _smallest_gpu(gpus) -> float | None:
    """memory.total (MiB) of the host's smallest GPU, as sglang reads it; None without GPU facts."""
    sizes = [g.memory_total_mib for g in getattr(gpus, "gpus", None) or [] if g.memory_total_mib]
    return float(min(sizes)) if sizes else None


def _plan_launch(t: TransportLike, host: Host, playbook: Playbook, svc: ServiceRead, version: str,
                 options: ResolvedOptions, gpu_mem: float | None = None) -> argv_ops.LaunchPlan:
    flags = render_flags(playbook, host.vars.template_view(), options.values)
    table = option_table(t, host.vars.python, version, host.name)
    # the operator's environment as systemd builds it (Environment=, EnvironmentFile=, the manager's;
    # fleetspec's own drop-in left out); a container's engine sees only its -e/--env (kept byte
    # for byte), not the unit's
    if isinstance(svc.form, ContainerRun):
        # the engine's -e variables (`-e NAME`: passed through from the unit's; its value is not needed)
        return argv_ops.plan_launch(svc.form.engine, table, flags, playbook, version,
                                    {n: v or "" for n, v in svc.form.env().items()},
                                    f"{host.name}: {svc.service}", gpu_mem, env_where="the container's -e")
    environment = execstart.engine_environment(
        svc.unit_bytes, svc.dropin_texts, svc.service, svc.env or HostEnv(), f"{host.name}: {svc.service}")
    return argv_ops.plan_launch(svc.form, table, flags, playbook, version, environment,
                                f"{host.name}: {svc.service}", gpu_mem)


"""Preflight: read everything about a host that a deploy depends on, and refuse before touching it.

Read-only. One batched round trip gathers the facts; then the checks run in order, each a
one-line refusal naming the host and what was expected: service found and healthy, no
interrupted deploy left switched, sglang version has a patch set and its base files are pristine,
kernels' ABI matches, hybrid guard, disk, model paths. The checks live in ops/preflight_checks.py,
the secrets in ops/redaction.py, the baseline record in ops/baseline.py; their names are kept here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from fleetspec.errors import NeedsAttention, UserError
from fleetspec.model import ledger as L
from fleetspec.model.baseline import Baseline
from fleetspec.model.inventory import Host
from fleetspec.model.kernel import Kernel
from fleetspec.model.launch import LaunchForm
from fleetspec.model.layout import HostLayout, local_mirror
from fleetspec.model.patchset import PatchSet
from fleetspec.model.playbook import Guard, Playbook
from fleetspec.ops import argv as argv_ops
from fleetspec.ops import probes, redaction
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.preflight_checks import (  # noqa: F401
    MAX_PATCH_FILE,
    MIN_FREE_BYTES,
    _model_path,
    abandon_unswitched,
    admin_exec_start_dropins,
    candidate_paths,
    check_contents,
    check_disk,
    check_dropin_order,
    check_gpus,
    check_interrupted,
    check_orphan_dropin,
    check_paths,
    check_templates,
    check_unit_drift,
    effective_argv,
    gather_unit,
    gather_unit_and_files,
    holder_first,
    installed_hashes,
    kernel_facts,
    load_kernels,
    model_paths,
    preload_patchsets,
    read_unit_files,
    select_patchset,
)
from fleetspec.ops.redaction import check_secret_env, redact, secret_refs, secrets_of  # noqa: F401
from fleetspec.remote import facts
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import FactError, file_text, missing_paths, unitfile
from fleetspec.remote.facts import disk as disk_fact
from fleetspec.remote.facts import gpu as gpu_fact
from fleetspec.remote.facts import model_config as model_fact
from fleetspec.remote.facts import sglang as sglang_fact
from fleetspec.remote.facts import systemd as systemd_fact
from fleetspec.remote.facts import torch as torch_fact
from fleetspec.remote.facts import unit_files as unit_files_fact
from fleetspec.remote.facts.sglang import SglangInstall
from fleetspec.remote.facts.systemd import SystemdUnit
from fleetspec.remote.facts.torch import TorchInfo

if TYPE_CHECKING:
    from fleetspec.ops.deploy import DeployRequest
    from fleetspec.ops.gates import Measurement


@dataclass
class Preflight:
    host: Host
    root: Path
    playbook: Playbook
    service: str
    python: str
    unit: SystemdUnit
    unit_bytes: bytes
    dropins: dict[str, bytes]                     # admin drop-ins, fleetspec's own excluded
    exec_argv: list[str]
    sglang: SglangInstall
    torch: TorchInfo | None
    hybrid: bool
    options: argv_ops.ResolvedOptions
    new_argv: list[str]
    patchset: PatchSet | None
    kernels: list[Kernel]
    notes: list[str] = field(default_factory=list)
    baseline: Baseline | None = None
    keep_releases: int = 3
    guard: Guard | None = None
    before: Measurement | None = None             # the service's figures before the switch (gates)
    form: LaunchForm | None = None                # the baseline ExecStart's launch form
    launch: argv_ops.LaunchPlan | None = None     # kept/dropped/carried, env verdicts
    staged_ahead: str | None = None               # the newest release `deploy --stage-only` left for this algo

    @property
    def layout(self) -> HostLayout:
        return HostLayout(self.service)

    @property
    def staged_ahead_note(self) -> str | None:
        """Said by a deploy and its plan, never a release's own note (a manifest must not change with it)."""
        return (f"{self.host.name}: release {self.staged_ahead} was staged ahead (deploy --stage-only): this deploy "
                "switches to it, taken as it is when it would stage the same release (else restaged)"
                if self.staged_ahead else None)

    @property
    def playbook_algorithm(self) -> str:
        return self.playbook.speculative_algorithm

    @property
    def patchset_name(self) -> str | None:
        return self.patchset.root.name if self.patchset else None

    # What the later steps need -----------------------------------------------------------------
    def patch_files(self) -> dict[str, bytes]:
        if not self.patchset:
            return {}
        return {f.path: self.patchset.source(f).read_bytes() for f in self.patchset.files}

    def kernel_files(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for kernel in self.kernels:
            out.update(kernel.file_bytes())
        return out

    def smoke_scripts(self, kernels_dir: str):
        """(name, python source, parse(stdout, stderr, rc) -> dict) for each smoke test the
        playbook asks for, in the order they run."""
        from fleetspec.ops import smoke

        def parse(stdout, stderr, rc):
            result = smoke.parse_result(stdout)
            data = dict(result.data)
            if not result.ok and not data.get("error"):
                data["error"] = (stderr.strip().splitlines() or [f"exit {rc}"])[-1]
            data["ok"] = result.ok and rc == 0
            return data

        want = self.playbook.smoke
        out = []
        if want.imports:
            out.append(("imports", smoke.imports_script(list(want.imports)), parse))
        if want.parse_args:
            out.append(("parse_args", smoke.parse_args_script(self.parse_slice()), parse))
        required = self.playbook.kernel_policy == "required"
        if want.kernels:   # before ddtree_sample: the payload loads the release's library either way
            for kernel in self.kernels:
                for name in kernel.file_bytes():
                    out.append((f"kernel:{name}", smoke.kernel_script(f"{kernels_dir}/{name}", required), parse))
        if want.ddtree_sample:
            out.append(("ddtree_sample", smoke.ddtree_sample_script(kernel_required=required and bool(self.kernels)),
                        parse))
        return out

    def parse_slice(self) -> list[str]:
        """Exactly what sglang's entry point hands its parser for the new argv (both forms)."""
        from fleetspec.model.launch import parsed_args

        return parsed_args(self.form, self.new_argv, self.sglang.version)

    @property
    def exec_prefix(self) -> str:
        return self.form.prefix if self.form else ""

    @property
    def exec_path(self) -> str | None:
        return self.form.path if self.form and "@" in self.form.prefix else None

    def environment(self, release) -> dict[str, str]:
        env = dict(self.playbook.launch.env)
        if release.files and release.mode == "release":
            env["PYTHONPATH"] = f"{self.layout.current}/overlay"
        if release.kernels:
            env["FLEETSPEC_KERNELS"] = f"{self.layout.current}/kernels"
        return env

    def probe_spec(self, expected: str | None) -> probes.ProbeSpec:
        return probes.spec_for_host(self.host, expected, self.playbook.probes)

    def secret_values(self) -> dict[str, str]:
        """launch.secret_env: each name's value from fleetspec's own environment (checked by run())."""
        return {name: os.environ[name] for name in self.playbook.launch.secret_env}

    def redact(self, text: str) -> str:
        return redaction.redact(text, self.host, self.playbook, [*self.exec_argv, *self.new_argv])

    def gate_names(self) -> list[str]:
        g = self.playbook.gates
        return [name for name in ("acceptance", "throughput", "parity") if getattr(g, name) is not None]

    def summary(self) -> dict:
        return {"sglang": self.sglang.version, "torch": getattr(self.torch, "version", None),
                "hybrid": self.hybrid, "options": dict(self.options.values), "notes": self.notes,
                "patchset": self.patchset_name, "argv": self.new_argv,
                "launch": self.launch.to_dict() if self.launch else None}


def run(t: TransportLike, req: DeployRequest, echo: Callable[[str], None] = print) -> Preflight:
    """Read the host and refuse bad input (exit 2) or a host that needs an operator (exit 3)."""
    host, playbook = req.host, req.playbook
    check_secret_env(host, playbook)           # before the host is even contacted
    t.check_access()                           # become: sudo that cannot act as root: one line, exit 2
    loaded = preload_patchsets(playbook)
    got = gather_host(t, host, candidate_paths(loaded))
    svc = read_service(t, host, playbook, req.root, got)
    for k in ("sglang", "torch"):             # the host's python is one others could change: refused, said why
        if isinstance(got[k], FactError) and "runs as root, but" in str(got[k]):
            raise UserError(f"{got[k]} (vars.python in {host.inventory_path})")
    sg, tv, disk, model, gpus = (_or_none(got[k]) for k in ("sglang", "torch", "disk", "model", "gpus"))
    path = _model_path(host, svc.exec_argv)
    if path != _model_path(host, []):          # ExecStart names another model than the inventory
        model = facts.gather_many(t, [(model_fact, {"path": path})])[0]
    if sg is None or not getattr(sg, "version", None):
        raise UserError(f"{host.name}: no sglang found for python {host.vars.python} "
                        f"(vars.python in {host.inventory_path})")
    hybrid = bool(getattr(model, "is_hybrid", False)) or host.is_hybrid_tagged
    options = argv_ops.resolve_options(playbook, req.options, hybrid)
    notes = [f"{host.name}: {n}" for n in options.notes]
    notes.extend(f"{host.name}: the admin drop-in {p} sets ExecStart=; fleetspec's drop-in (applied after it) "
                 f"replaces that command, and rollback puts it back" for p in svc.overriding)
    launch = _plan_launch(t, host, playbook, svc, sg.version, options)
    notes.extend(f"{host.name}: {n}" for n in launch.notes)
    patchset = select_patchset(t, playbook, sg, host.name, loaded)
    kernels = load_kernels(playbook, kernel_facts(tv, gpus), host.name)
    check_disk(host, disk, patchset, kernels)
    check_paths(t, host, playbook, _raised(got["missing"]))
    notes.extend(check_gpus(host, gpus))
    pf = Preflight(host=host, root=req.root, playbook=playbook, service=svc.service, python=host.vars.python,
                   unit=svc.unit, unit_bytes=svc.unit_bytes, dropins=svc.dropins, exec_argv=svc.exec_argv,
                   sglang=sg, torch=tv, hybrid=hybrid, options=options, new_argv=launch.derived.argv,
                   patchset=patchset, kernels=kernels, notes=notes, guard=playbook.guard, form=svc.form,
                   launch=launch, keep_releases=int(host.vars.extra.get("keep_releases", playbook.keep_releases)),
                   staged_ahead=next(reversed(L.parse(_raised(got["ledger"]) or "").staged_ahead(playbook.algo)), None))
    check_templates(pf)
    for note in notes:
        echo(note)
    return pf


@dataclass
class ServiceRead:
    """The service as preflight found it: systemd's view, the unit files, the operator's ExecStart."""
    service: str
    unit: SystemdUnit
    unit_bytes: bytes
    dropins: dict[str, bytes]
    dropin_texts: list[str]
    exec_argv: list[str]
    form: LaunchForm
    overriding: list[str]


def gather_host(t: TransportLike, host: Host, hash_paths: tuple[str, ...] = ()) -> dict:
    """Every fact preflight reads, in one round trip (status's batching, facts.gather_many); a
    failed fact is its FactError, raised or read as None where the check that needs it runs.
    The model's config is read at the inventory's model_path; read_service's ExecStart may name
    another, read again then. `hash_paths`: every patch-set path the playbook could need, hashed
    by the sglang fact (the version that picks the patch set is not known before the batch)."""
    service, python = host.vars.service, host.vars.python
    layout = HostLayout(service)
    return facts.gather_many(t, {
        "unit": (systemd_fact, {"service": service}),
        "files": (unit_files_fact, {"service": service}),
        "ledger": (file_text, {"path": str(layout.ledger)}),
        "sglang": (sglang_fact, {"python": python, "hash_paths": tuple(hash_paths)}),
        "torch": (torch_fact, {"python": python}),
        "disk": (disk_fact, {"path": str(layout.root)}),
        "model": (model_fact, {"path": _model_path(host, [])}),
        "gpus": (gpu_fact, {}),
        "missing": (missing_paths, {"paths": tuple(model_paths(host))}),
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
            command = unitfile.effective_exec_command(unit_bytes.decode(errors="replace"), dropin_texts)
        except ValueError as err:
            raise UserError(f"{host.name}: cannot read ExecStart of {service} from {unit.fragment_path}: {err}") from None
        form = argv_ops.classify_or_refuse(command, f"{host.name}: {service}")
        check_dropin_order(unit, host, service)
        overriding = admin_exec_start_dropins(unit, dropin_texts)
        check_interrupted(state, host.name, L.parse(_raised(got["ledger"]) or ""))
        mirrored = HostState(t, host.name, service, mirror=local_mirror(root, host, service))
        check_unit_drift(mirrored, host.name, service, unit_bytes, dropins, secret_refs(host, playbook),
                         baseline_text=files_fact.baseline_json)
        if unit.active_state != "active":
            raise NeedsAttention(f"{host.name}: {service} is {unit.active_state} before the deploy; fleetspec only "
                                 f"moves a running service", f"ssh {host.address} systemctl status {service}")
    return ServiceRead(service, unit, unit_bytes, dropins, dropin_texts, list(command.argv), form, overriding)


def _plan_launch(t: TransportLike, host: Host, playbook: Playbook, svc: ServiceRead, version: str,
                 options: argv_ops.ResolvedOptions) -> argv_ops.LaunchPlan:
    flags = argv_ops.render_flags(playbook, host.vars.template_view(), options.values)
    table = argv_ops.option_table(t, host.vars.python, version, host.name)
    # the operator's environment, from the unit files (fleetspec's own drop-in left out)
    environment = unitfile.effective_environment(svc.unit_bytes.decode(errors="replace"), svc.dropin_texts)
    return argv_ops.plan_launch(svc.form, table, flags, playbook, version, environment,
                                f"{host.name}: {svc.service}")


"""Preflight: read everything about a host that a deploy depends on, and refuse before touching it.

Read-only. One batched round trip gathers the facts; then the checks run in order, each a
one-line refusal naming the host and what was expected: service found and healthy, no
interrupted deploy left switched, sglang version has a patch set and its base files are pristine,
kernels' ABI matches, hybrid guard, disk, model paths.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleetspec.errors import NeedsAttention, RemoteError, UserError
from fleetspec.model import ledger as L
from fleetspec.model.baseline import Baseline, recorded_environment
from fleetspec.model.layout import HostLayout
from fleetspec.model.playbook import load_playbook_for
from fleetspec.ops import argv as argv_ops
from fleetspec.ops import probes
from fleetspec.ops.hoststate import DROPIN_NAME, HostState, is_ours
from fleetspec.remote import facts
from fleetspec.remote.facts import disk as disk_fact
from fleetspec.remote.facts import gpu as gpu_fact
from fleetspec.remote.facts import model_config as model_fact
from fleetspec.remote.facts import sglang as sglang_fact
from fleetspec.remote.facts import systemd as systemd_fact
from fleetspec.remote.facts import torch as torch_fact
from fleetspec.remote.facts import unit_files as unit_files_fact
from fleetspec.remote.facts import unitfile

q = shlex.quote
MIN_FREE_BYTES = 256 * 1024 * 1024
MAX_PATCH_FILE = 64 * 1024 * 1024      # a module; anything bigger is a mistake, and it is read into memory


@dataclass
class Preflight:
    host: object
    root: Path
    playbook: object
    service: str
    python: str
    unit: object                                  # facts.systemd result
    unit_bytes: bytes
    dropins: dict[str, bytes]                     # admin drop-ins, fleetspec's own excluded
    exec_argv: list[str]
    sglang: object                                # facts.sglang result
    torch: object
    hybrid: bool
    options: argv_ops.ResolvedOptions
    new_argv: list[str]
    patchset: object | None
    kernels: list
    notes: list[str] = field(default_factory=list)
    baseline: Baseline | None = None
    keep_releases: int = 3
    guard: object | None = None                   # model.playbook.Guard
    before: object | None = None                  # gates.Measurement of the service before the switch
    form: object | None = None                    # model.launch.LaunchForm of the baseline ExecStart
    launch: object | None = None                  # ops.argv.LaunchPlan: kept/dropped/carried, env verdicts

    @property
    def layout(self) -> HostLayout:
        return HostLayout(self.service)

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

    def overlay_script(self, patch_dir: str, dest: str) -> str:
        from fleetspec.remote.overlay import overlay_script

        return overlay_script(self.sglang.site_packages, patch_dir, dest, self.patchset)

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
        return redact(text, self.host, self.playbook)

    def gate_names(self) -> list[str]:
        g = self.playbook.gates
        return [name for name in ("acceptance", "throughput", "parity") if getattr(g, name) is not None]

    def summary(self) -> dict:
        return {"sglang": self.sglang.version, "torch": getattr(self.torch, "version", None),
                "hybrid": self.hybrid, "options": dict(self.options.values), "notes": self.notes,
                "patchset": self.patchset_name, "argv": self.new_argv,
                "launch": self.launch.to_dict() if self.launch else None}


def secrets_of(host, playbook) -> list[str]:
    """Every secret value fleetspec holds for this host and playbook (never printed or recorded)."""
    values = [host.vars.api_key.value()] if host.vars.api_key else []
    values += [os.environ.get(name) for name in playbook.launch.secret_env]
    return [v for v in values if v]


def secret_refs(host, playbook=None) -> tuple[list[str], list[str]]:
    """(names, values) of the variables whose values are never shown: the inventory's api_key
    and the playbook's launch.secret_env (pattern-named ones are caught by model.baseline)."""
    names = [host.vars.api_key.env] if host.vars.api_key else []
    names += list(playbook.launch.secret_env) if playbook is not None else []
    return names, secrets_of(host, playbook) if playbook is not None else \
        [v for v in [host.vars.api_key.value() if host.vars.api_key else None] if v]


def redact(text: str, host, playbook) -> str:
    for value in sorted(secrets_of(host, playbook), key=len, reverse=True):
        for form in dict.fromkeys([value, json.dumps(value)[1:-1]]):
            text = text.replace(form, "<redacted>")
    return text


def check_secret_env(host, playbook) -> None:
    for name in playbook.launch.secret_env:
        if not (name[:1].isalpha() or name[:1] == "_") or not name.replace("_", "a").isalnum():
            raise UserError(f"{playbook.path}: launch.secret_env: {name!r} is not an environment variable name")
        value = os.environ.get(name)
        if value is None or value == "":
            raise UserError(f"{host.name}: {playbook.path}: launch.secret_env names {name}, which is not set in "
                            f"fleetspec's environment")
        if "\n" in value or "\0" in value:
            raise UserError(f"{host.name}: the value of {name} (launch.secret_env) holds a newline or NUL")


def run(t, req, echo=print) -> Preflight:
    host, playbook = req.host, req.playbook
    service, python = host.vars.service, host.vars.python
    state = HostState(t, host.name, service)
    check_secret_env(host, playbook)           # before the host is even contacted

    unit, files_fact = gather_unit_and_files(t, service)
    if unit.load_state != "loaded" or not unit.fragment_path:
        raise UserError(f"{host.name}: service {service} not found (LoadState={unit.load_state}); "
                        f"check vars.service in {host.inventory_path}")
    unit_bytes, dropins, dropin_texts = read_unit_files(t, unit, files_fact)
    check_orphan_dropin(state, unit, host)
    try:
        command = unitfile.effective_exec_command(unit_bytes.decode(errors="replace"), dropin_texts)
    except ValueError as err:
        raise UserError(f"{host.name}: cannot read ExecStart of {service} from {unit.fragment_path}: {err}") from None
    exec_argv = list(command.argv)
    form = argv_ops.classify_or_refuse(command, f"{host.name}: {service}")
    check_dropin_order(unit, host, service)
    overriding = admin_exec_start_dropins(unit, dropin_texts)
    check_interrupted(state, host.name)
    mirrored = HostState(t, host.name, service, mirror=req.root / ".fleetspec" / "hosts" / host.name / service)
    check_unit_drift(mirrored, host.name, service, unit_bytes, dropins, secret_refs(host, playbook))
    if unit.active_state != "active":
        raise NeedsAttention(f"{host.name}: {service} is {unit.active_state} before the deploy; fleetspec only "
                             f"moves a running service", f"ssh {host.address} systemctl status {service}")

    sg, tv, disk, model, gpus = facts.gather_many(t, [
        (sglang_fact, {"python": python}),
        (torch_fact, {"python": python}),
        (disk_fact, {"path": str(state.layout.root)}),
        (model_fact, {"path": _model_path(host, exec_argv)}),
        (gpu_fact, {}),
    ])
    if sg is None or not getattr(sg, "version", None):
        raise UserError(f"{host.name}: no sglang found for python {python} (vars.python in {host.inventory_path})")
    hybrid = bool(getattr(model, "is_hybrid", False)) or host.is_hybrid_tagged
    options = argv_ops.resolve_options(playbook, req.options, hybrid)
    notes = [f"{host.name}: {n}" for n in options.notes]
    notes.extend(f"{host.name}: the admin drop-in {p} sets ExecStart=; fleetspec's drop-in (applied after it) "
                 f"replaces that command, and rollback puts it back" for p in overriding)
    flags = argv_ops.render_flags(playbook, host.vars.template_view(), options.values)
    table = argv_ops.option_table(t, python, sg.version, host.name)
    # the operator's environment, from the unit files (fleetspec's own drop-in left out)
    environment = unitfile.effective_environment(unit_bytes.decode(errors="replace"), dropin_texts)
    launch = argv_ops.plan_launch(form, table, flags, playbook, sg.version, environment, f"{host.name}: {service}")
    new_argv = launch.derived.argv
    notes.extend(f"{host.name}: {n}" for n in launch.notes)

    patchset = select_patchset(t, playbook, sg, host.name)
    kernels = load_kernels(playbook, kernel_facts(tv, gpus), host.name)
    payload = _payload_bytes(patchset, kernels)
    need = MIN_FREE_BYTES + 2 * payload          # the uploaded objects, then their copies in the release
    if disk is not None and getattr(disk, "free_bytes", None) is not None and disk.free_bytes < need:
        raise UserError(f"{host.name}: only {disk.free_bytes // 2**20} MiB free under /var/lib; "
                        f"need {need // 2**20} MiB")
    check_paths(t, host, playbook)
    notes.extend(check_gpus(host, gpus))
    pf = Preflight(host=host, root=req.root, playbook=playbook, service=service, python=python, unit=unit,
                   unit_bytes=unit_bytes, dropins=dropins, exec_argv=exec_argv, sglang=sg, torch=tv,
                   hybrid=hybrid, options=options, new_argv=new_argv, patchset=patchset, kernels=kernels,
                   notes=notes, guard=playbook.guard, form=form, launch=launch,
                   keep_releases=int(host.vars.extra.get("keep_releases", playbook.keep_releases)))
    check_templates(pf)
    for note in notes:
        echo(note)
    return pf


# Pieces -------------------------------------------------------------------------------------------
def gather_unit(t, service: str):
    return systemd_fact.parse(t.run_script(systemd_fact.command(service), timeout=30, check=True).stdout)


def gather_unit_and_files(t, service: str):
    """The unit's state and the bytes of its files, in one round trip (no SFTP session)."""
    unit, files_fact = facts.gather_many(t, [(systemd_fact, {"service": service}),
                                             (unit_files_fact, {"service": service})], errors="raise")
    return unit, files_fact


def read_unit_files(t, unit, files_fact=None) -> tuple[bytes, dict[str, bytes], list[str]]:
    """The unit's and the operator's drop-ins' bytes, in systemd's order; from `files_fact` (the
    unit_files fact) where it holds them, else read over SFTP (a path the fact's shell loop split)."""
    have = dict(files_fact.dropins) if files_fact is not None else {}
    if files_fact is not None and files_fact.fragment_path == unit.fragment_path and files_fact.unit_bytes is not None:
        have[unit.fragment_path] = files_fact.unit_bytes
    unit_bytes = have[unit.fragment_path] if unit.fragment_path in have else t.get_bytes(unit.fragment_path)
    dropins, texts = {}, []
    for path in unit.dropin_paths:
        if is_ours(path):
            continue
        data = have[path] if path in have else t.get_bytes(path)
        texts.append(data.decode(errors="replace"))
        dropins[path] = data
    return unit_bytes, dropins, texts


def effective_argv(unit_bytes: bytes, dropin_texts: list[str]) -> list[str]:
    """ExecStart as the operator set it: the unit's, overridden by their drop-ins in order
    (fleetspec's own drop-in is left out by read_unit_files)."""
    return unitfile.effective_exec_start(unit_bytes.decode(errors="replace"), dropin_texts)


def check_dropin_order(unit, host, service: str) -> None:
    """fleetspec's drop-in must be the last word on ExecStart=: systemd applies drop-ins sorted by
    file name, so an admin drop-in named after ours would win and the release would serve the old
    command. Refused here, before anything changes; the check after daemon-reload catches the rest."""
    from fleetspec.ops.hoststate import sorts_after_ours

    later = [p for p in unit.dropin_paths if sorts_after_ours(p)]
    if later:
        raise UserError(f"{host.name}: {service}: the drop-in {later[0]} sorts after fleetspec's "
                        f"({DROPIN_NAME}) and would override its ExecStart=; rename it so it sorts before "
                        f"{DROPIN_NAME} (e.g. 40-…conf)")


def admin_exec_start_dropins(unit, dropin_texts: list[str]) -> list[str]:
    """The admin drop-ins (fleetspec's excluded, in systemd's order) that set ExecStart=."""
    paths = [p for p in unit.dropin_paths if not is_ours(p)]
    out = []
    for path, text in zip(paths, dropin_texts):
        try:
            if unitfile.parse_unit(text).values("Service", "ExecStart"):
                out.append(path)
        except ValueError:
            out.append(path)
    return out


def check_orphan_dropin(state: HostState, unit, host) -> None:
    """fleetspec's drop-in without fleetspec's state (the folder was deleted or the disk lost):
    the service runs a release nobody can describe, so no baseline may be taken from it."""
    if any(is_ours(p) for p in unit.dropin_paths) and state.read_baseline() is None:
        raise NeedsAttention(
            f"{host.name}: {state.dropin} is there but {state.layout.baseline} is not: fleetspec's state was "
            f"lost while a release was active; check the unit, remove the drop-in, reload and restart, then retry",
            f"ssh {host.address} 'rm {state.dropin} && systemctl daemon-reload && systemctl restart {state.service}'")


def check_interrupted(state: HostState, host: str, ledger=None) -> None:
    """A deploy that died after `switch` leaves the host on a release nobody proved: refuse until
    `rollback` has finished it. One that died before `switch` changed nothing that runs: mark it.
    `ledger`: the ledger already read under the same lock (one read for this and abandon_unswitched)."""
    ledger = ledger if ledger is not None else state.ledger()
    for rid in ledger.interrupted():
        status = ledger.releases()[rid]
        last = ledger.last_step(rid)
        where = f"at step {last.name} ({last.state})" if last else "before its first step"
        if status == L.SWITCHED:
            raise NeedsAttention(f"{host}: deploy {rid} was interrupted {where} after switching the service",
                                 f"fleetspec rollback {host}")


def check_unit_drift(state: HostState, host: str, service: str, unit_bytes: bytes, dropins: dict,
                     secrets: tuple = ((), ())) -> None:
    """A unit edited by hand since the baseline is refused before anything is locked or written:
    the baseline is never silently replaced, and a deploy never builds on a state nobody recorded."""
    baseline = state.read_baseline(repair=False)      # read-only here; the locked baseline step repairs
    drift = baseline.differences(unit_bytes, dropins, *secrets) if baseline is not None else []
    if drift:
        raise NeedsAttention(f"{host}: {service} changed by hand since the baseline: {'; '.join(drift)}; "
                             f"review it, then record it", f"fleetspec baseline {host} --retake")


def abandon_unswitched(state: HostState, running: str, ledger=None) -> list[str]:
    """Mark deploys that died before `switch` as failed: they changed nothing that runs."""
    ledger = ledger if ledger is not None else state.ledger()
    out = []
    for rid in ledger.interrupted():
        if rid != running and ledger.releases()[rid] != L.SWITCHED:
            state.record(L.Entry.status(rid, L.FAILED, reason="interrupted before switch; host unchanged"))
            out.append(rid)
    return out


def _model_path(host, exec_argv: list[str]) -> str:
    for i, token in enumerate(exec_argv):
        if token == "--model-path" and i + 1 < len(exec_argv):
            return exec_argv[i + 1]
        if token.startswith("--model-path="):
            return token.split("=", 1)[1]
    return host.vars.model_path or "/nonexistent"


def select_patchset(t, playbook, sg, host: str):
    if not playbook.patchsets:
        return None
    from fleetspec.model.patchset import check_base, load_patchset, select_patchset as pick

    folder = pick(playbook.patchsets, sg.version, host=host)
    patchset = load_patchset(folder)
    check_contents(patchset)
    try:
        check_base(patchset, sg.version, installed_hashes(t, sg.site_packages, patchset))
    except UserError as err:
        raise UserError(f"{host}: {err}") from None
    return patchset


def check_templates(pf: Preflight) -> None:
    """Render the drop-in once here, so a broken template is bad input (exit 2) found before the
    host is locked or written to, not an internal error half-way through a deploy."""
    import jinja2

    from fleetspec.errors import ConfigError
    from fleetspec.model.release import BASELINE, Release
    from fleetspec.ops import switching

    fake = Release(id="<new>", host=pf.host.name, service=pf.service, algo=pf.playbook.algo, mode="release",
                   sglang_version=pf.sglang.version, argv=pf.new_argv, previous=BASELINE,
                   exec_prefix=pf.exec_prefix, exec_path=pf.exec_path,
                   launch=pf.launch.to_dict() if pf.launch else {})
    try:
        switching.dropin_text(pf, fake)
    except jinja2.TemplateError as err:
        where = getattr(err, "filename", None) or str(pf.root / "templates" / "fleetspec-dropin.conf.j2")
        line = f" line {err.lineno}" if getattr(err, "lineno", None) else ""
        raise ConfigError(where, None, f"a template that renders ({type(err).__name__}{line}: {err})") from None


def check_contents(patchset) -> None:
    """Every file is what the manifest says (an edit after `patchset build` is refused, not shipped)
    and of a sane size (checked before anything is read)."""
    from fleetspec.errors import ConfigError
    from fleetspec.model.patchset import FILES, sha256_file

    for i, entry in enumerate(patchset.files):
        src = patchset.source(entry)
        size = src.stat().st_size
        if size > MAX_PATCH_FILE:
            raise ConfigError(patchset.manifest_path, f"files[{i}] ({entry.path})",
                              f"a file of at most {MAX_PATCH_FILE // 2**20} MiB; {FILES}/{entry.path} is "
                              f"{size // 2**20} MiB")
        got = sha256_file(src)
        if got != entry.sha256:
            raise ConfigError(patchset.manifest_path, f"files[{i}] ({entry.path}).sha256",
                              f"the sha256 of {FILES}/{entry.path}, which is now {got} (changed since the patch set "
                              f"was built; rebuild it with fleetspec patchset build)")


def _payload_bytes(patchset, kernels) -> int:
    total = sum(patchset.source(f).stat().st_size for f in patchset.files) if patchset else 0
    for kernel in kernels:
        total += kernel.path.stat().st_size
    return total


def installed_hashes(t, site_packages: str, patchset) -> dict[str, str]:
    """sha256 of each of the patch set's paths as installed on the host (absent ones omitted)."""
    from fleetspec.remote import files

    paths = {f"{site_packages}/{f.path}": f.path for f in patchset.files}
    got = files.parse_sha256sum(t.run_script(files.sha256_of(sorted(paths)), timeout=60, check=True).stdout)
    return {paths[p]: digest for p, digest in got.items() if p in paths}


def load_kernels(playbook, torch_facts, host: str) -> list:
    """For each kernel folder, the build matching the host's ABI facts (torch, python, CUDA or cpu,
    C++ ABI, GPU arch); none matching is refused whatever the kernel_policy, naming both sides and
    the command that builds it. The policy decides what a library that then does not load means:
    required fails the smoke tests, optional falls back to torch with a note."""
    if not playbook.kernels:
        return []
    from fleetspec.model.kernel import find_built_kernel

    from fleetspec.errors import ConfigError
    from fleetspec.model.kernel import KERNEL_JSON
    from fleetspec.model.patchset import sha256_file

    out = []
    for folder in playbook.kernels:
        kernel = find_built_kernel(folder, torch_facts, host=host)
        if sha256_file(kernel.path) != kernel.sha256:     # here, not half-way through staging
            raise ConfigError(kernel.spec.root / KERNEL_JSON, "build.sha256",
                              f"the sha256 of {kernel.library_file} (it changed since the build)")
        out.append(kernel)
    return out


def kernel_facts(torch_facts, gpus) -> dict:
    """The ABI facts a kernel build must match: the torch fact's, plus the GPUs' compute
    capabilities from nvidia-smi (a CUDA build must carry code for each)."""
    from fleetspec.model.kernel import host_abi

    facts = host_abi(torch_facts) if torch_facts is not None else {"torch": None}
    caps = sorted({g.compute_cap for g in getattr(gpus, "gpus", []) or [] if getattr(g, "compute_cap", None)})
    if caps:
        facts["gpu_arch"] = tuple(caps)
    return facts


def check_gpus(host, gpus) -> list[str]:
    """The GPUs the inventory promises are there (nvidia-smi). A host without nvidia-smi is
    refused unless its inventory says `extra.require_gpus: false` (CPU test hosts)."""
    want = host.vars.gpu_count
    if gpus is None or not gpus.present:
        if host.vars.extra.get("require_gpus", True):
            raise UserError(f"{host.name}: no nvidia-smi on the host, but it should have "
                            f"{want or 'its'} GPUs (set vars.extra.require_gpus: false in "
                            f"{host.inventory_path} for a host without GPUs)")
        return [f"{host.name}: no GPU on this host (require_gpus: false); GPU health not checked"]
    if want is not None and len(gpus.gpus) < want:
        raise UserError(f"{host.name}: nvidia-smi shows {len(gpus.gpus)} GPU(s), the inventory says {want}")
    return []


def check_paths(t, host, playbook) -> None:
    paths = [p for p in (host.vars.model_path, host.vars.draft_model_path) if p]
    if not paths:
        return
    script = "; ".join(f"[ -e {q(p)} ] || echo {q(p)}" for p in paths)
    missing = t.run_script(script, timeout=30, check=False).stdout.split()
    if missing:
        raise UserError(f"{host.name}: model path {missing[0]} does not exist on the host "
                        f"(vars in {host.inventory_path})")


def take_baseline(t, pf: Preflight) -> Baseline:
    """Record the service as found: unit bytes, drop-ins, ExecStart, Environment, sglang, served algo."""
    served = None
    try:
        r = t.http("GET", pf.host.vars.api_port, "/server_info", timeout=10)
        if r.status == 200:
            served = json.loads(r.body).get("speculative_algorithm")
    except (RemoteError, ValueError):
        pass
    from fleetspec.model.ledger import actor

    return Baseline(
        service=pf.service, unit_path=pf.unit.fragment_path, unit_bytes=pf.unit_bytes, dropins=pf.dropins,
        exec_argv=pf.exec_argv,
        environment=recorded_environment(pf.unit_bytes, pf.dropins, *secret_refs(pf.host, getattr(pf, "playbook", None))),
        sglang={"version": pf.sglang.version, "site_packages": pf.sglang.site_packages,
                "python": pf.python, "drift": list(pf.sglang.drift)},
        served_algorithm=served,
        declared_algorithm=(pf.launch.derived.algorithm if getattr(pf, "launch", None)
                            else argv_ops.speculative_algorithm_from_argv(pf.exec_argv)),
        taken_at=time.time(), taken_by=actor(),
    )

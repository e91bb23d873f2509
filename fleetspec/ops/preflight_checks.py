"""Preflight's checks, each a one-line refusal naming the host and what was expected, and the
reads they need (unit files, installed hashes, kernels). Nothing here changes a host, except
`abandon_unswitched`, which marks dead deploys in the ledger under the lock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fleetspec import systemd_unit
from fleetspec.errors import NeedsAttention, UserError
from fleetspec.model import ledger as L
from fleetspec.model.inventory import Host
from fleetspec.model.playbook import Playbook
from fleetspec.ops.hoststate import DROPIN_NAME, HostState, is_ours
from fleetspec.remote import files, systemd
from fleetspec.remote import lock as lock_mod
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts.systemd import SystemdUnit
from fleetspec.remote.facts.unit_files import UnitFiles

if TYPE_CHECKING:
    from fleetspec.ops.preflight_result import Preflight

MIN_FREE_BYTES = 256 * 1024 * 1024
MAX_PATCH_FILE = 64 * 1024 * 1024      # a module; anything bigger is a mistake, and it is read into memory
UNREAD = object()                      # a fact not gathered in preflight's batch: the check reads it itself


def gather_unit(t: TransportLike, service: str) -> SystemdUnit:
    return systemd.show(t, service)


def read_unit_files(t: TransportLike, unit: SystemdUnit,
                    files_fact: UnitFiles | None = None) -> tuple[bytes, dict[str, bytes], list[str]]:
    """The unit's and the operator's drop-ins' bytes, in systemd's order; from `files_fact` (the
    unit_files fact) where it holds them, else read over SFTP (a path the fact's shell loop split)."""
    fragment = unit.fragment_path or ""          # read_service refused a unit without one
    have = dict(files_fact.dropins) if files_fact is not None else {}
    if files_fact is not None and files_fact.fragment_path == fragment and files_fact.unit_bytes is not None:
        have[fragment] = files_fact.unit_bytes
    unit_bytes = have[fragment] if fragment in have else t.get_bytes(fragment)
    dropins, texts = {}, []
    for path in unit.dropin_paths:
        if is_ours(path):
            continue
        data = have[path] if path in have else t.get_bytes(path)
        texts.append(data.decode(errors="replace"))
        dropins[path] = data
    return unit_bytes, dropins, texts


def check_loaded(unit, host, service: str) -> None:
    """Files changed on disk that systemd has not loaded yet (an edit without daemon-reload, of the
    unit, a drop-in or a Quadlet file) would go live with the deploy's own reload, unrecorded and
    unreviewed: refused before anything changes."""
    if unit.need_daemon_reload:
        changed = unit.source_path if unit.source_path else unit.fragment_path
        raise NeedsAttention(f"{host.name}: {service}: its unit files ({changed} or a drop-in) changed on disk since "
                             f"systemd loaded them (NeedDaemonReload=yes); a deploy's daemon-reload would start "
                             f"that change unrecorded. Review it, load it, then deploy",
                             systemd.on_host_command(host.name, systemd.DAEMON_RELOAD))


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
    for path, text in zip(paths, dropin_texts, strict=True):
        try:
            if systemd_unit.parse_unit(text).values("Service", "ExecStart"):
                out.append(path)
        except ValueError:
            out.append(path)
    return out


def check_orphan_dropin(state: HostState, unit, host, baseline_text: str | None | object = UNREAD) -> None:
    """fleetspec's drop-in without fleetspec's state (the folder was deleted or the disk lost):
    the service runs a release nobody can describe, so no baseline may be taken from it.
    `baseline_text`: baseline.json's text as the unit_files fact read it (else read here)."""
    if any(is_ours(p) for p in unit.dropin_paths) and _baseline(state, baseline_text, repair=True) is None:
        raise NeedsAttention(
            f"{host.name}: {state.dropin} is there but {state.layout.baseline} is not: fleetspec's state was "
            f"lost while a release was active; check the unit, remove the drop-in, reload and restart, then retry",
            systemd.on_host_command(host.address, systemd.remove_dropin_command(state.dropin, state.service)))


def check_interrupted(state: HostState, host: str, ledger: L.ParsedLedger | None = None) -> None:
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


@contextmanager
def holder_first(t, lock: str) -> Iterator[None]:
    """A look without the lock: a host that a live deploy or rollback is changing looks like one
    needing attention (a switched release not yet proved, its service mid-restart). Then the
    refusal is the lock's (exit 2, naming the holder), never an operator sent to repair a change
    still in flight; with the lock free, the NeedsAttention stands."""
    try:
        yield
    except NeedsAttention:
        held = lock_mod.busy(t, lock)
        if held is not None:
            raise held from None
        raise


def check_unit_drift(state: HostState, host: str, service: str, unit_bytes: bytes, dropins: dict,
                     secrets: tuple = ((), ()), baseline_text: str | None | object = UNREAD) -> None:
    """A unit edited by hand since the baseline is refused before anything is locked or written:
    the baseline is never silently replaced, and a deploy never builds on a state nobody recorded."""
    baseline = _baseline(state, baseline_text, repair=False)   # read-only here; the locked baseline step repairs
    drift = baseline.differences(unit_bytes, dropins, *secrets) if baseline is not None else []
    if drift:
        raise NeedsAttention(f"{host}: {service} changed by hand since the baseline: {'; '.join(drift)}; "
                             f"review it, then record it", f"fleetspec baseline {host} --retake")


def _baseline(state: HostState, text, repair: bool):
    return state.read_baseline(repair=repair) if text is UNREAD else state.baseline_from_text(text, repair=repair)


def _model_path(host, exec_argv: list[str]) -> str:
    for i, token in enumerate(exec_argv):
        if token == "--model-path" and i + 1 < len(exec_argv):
            return exec_argv[i + 1]
        if token.startswith("--model-path="):
            return token.split("=", 1)[1]
    return host.vars.model_path or "/nonexistent"


def check_templates(pf: "Preflight") -> None:
    """Render the drop-in once here, so a broken template is bad input (exit 2) found before the
    host is locked or written to, not an internal error half-way through a deploy."""
    import jinja2

    from fleetspec.errors import ConfigError
    from fleetspec.ops.rendering import dropin_text
    from fleetspec.ops.staging import new_release

    fake = new_release(pf, "<new>")
    try:
        dropin_text(pf, fake)
    except jinja2.TemplateError as err:
        where = getattr(err, "filename", None) or str(pf.root / "templates" / "fleetspec-dropin.conf.j2")
        lineno = getattr(err, "lineno", None)
        line = f" line {lineno}" if lineno else ""
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


def check_disk(host: Host, disk, patchset, kernels: list) -> None:
    """Room under the state root for the uploaded objects, then their copies in the release."""
    need = MIN_FREE_BYTES + 2 * _payload_bytes(patchset, kernels)
    if disk is not None and getattr(disk, "free_bytes", None) is not None and disk.free_bytes < need:
        raise UserError(f"{host.name}: only {disk.free_bytes // 2**20} MiB free under /var/lib; "
                        f"need {need // 2**20} MiB")


def check_gpus(host: Host, gpus) -> list[str]:
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


def model_paths(host: Host) -> list[str]:
    return [p for p in (host.vars.model_path, host.vars.draft_model_path) if p]


def check_paths(t: TransportLike, host: Host, playbook: Playbook, missing: list[str] | None = None) -> None:
    """`missing`: what the missing_paths fact found of model_paths(host) (else asked here)."""
    paths = model_paths(host)
    if not paths:
        return
    missing = files.missing_paths(t, paths) if missing is None else missing
    if missing:
        raise UserError(f"{host.name}: model path {missing[0]} does not exist on the host "
                        f"(vars in {host.inventory_path})")

"""GPU health at preflight and after a failed restart (rules in model/gpuhealth.py, facts in
remote/facts/gpu_health.py)."""

from __future__ import annotations

from fleetspec.errors import FleetspecError, NeedsAttention
from fleetspec.model import gpuhealth
from fleetspec.model.inventory import Host
from fleetspec.model.playbook import Playbook
from fleetspec.remote import facts
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import FactError
from fleetspec.remote.facts import gpu_health as gpu_health_fact


def gpu_waivers(host: Host, playbook: Playbook) -> set[str]:
    """The GPU checks let pass for this host: the playbook's gpu_health.waive (with the CLI's
    --waive-gpu folded in) and the inventory's vars.extra.gpu_waive (both checked at load)."""
    return set(playbook.gpu_waive) | set(host.vars.extra.get("gpu_waive", ()) or ())


def check_gpu_health(host: Host, playbook: Playbook, health, need: tuple[int, str] | None,
                     cuda: str | None) -> list[str]:
    """Refuse a host whose GPUs would fail the engine's load (model/gpuhealth.py), one line per
    GPU and cause, before anything changes (exit 3: the host needs an operator, not the input).
    Waived findings and what could not be read are notes. `health`: the gpu_health fact, a
    FactError when nvidia-smi is there but did not answer, None when there is no nvidia-smi."""
    waived = gpu_waivers(host, playbook)
    look = f"ssh {host.address} nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER,PIDS"
    if isinstance(health, FactError):
        if set(gpuhealth.CHECKS) <= waived:
            return [f"{host.name}: GPU health not read ({health}); every GPU check is waived"]
        raise NeedsAttention(f"{host.name}: nvidia-smi did not report GPU health, refused before any change: {health}",
                             look)
    if health is None or not health.present:
        return []
    refused, let_pass = gpuhealth.split(gpuhealth.problems(health, need, cuda, host.vars.service), waived)
    notes = [f"{host.name}: waived GPU check {p.check}: {p.line}" for p in let_pass]
    notes += [f"{host.name}: GPU health: {u}" for u in health.unread]
    if health.kernel_log == "none":
        notes.append(f"{host.name}: the kernel log is not readable (journalctl -k, dmesg): Xids not checked")
    if refused:
        lines = [f"{host.name}: {p.line} [{p.check}]" for p in refused]
        raise NeedsAttention("\n".join([*lines, f"{host.name}: refused before any change; {gpuhealth.WAIVE_HINT}"]),
                             look)
    return notes


def cause_since(t: TransportLike, host: Host, before) -> list[str]:
    """What appeared on the host's GPUs since `before` (preflight's reading; a restart in
    between), read now in one command: ["Xid 79 on GPU 3 at 12:01:07", …]; nvidia-smi that no
    longer answers is a cause too. [] when preflight read no GPUs."""
    if before is None or not before.present:
        return []
    try:
        after = facts.gather(t, gpu_health_fact, service=host.vars.service, timeout=60)
    except FactError as err:
        return [f"nvidia-smi no longer answers ({str(err).splitlines()[0][:200]})"]
    except FleetspecError:       # the host is failing to answer: the revert says so
        return []
    return gpuhealth.since(before, after)

"""GPU health rules: which nvidia-smi and kernel-log findings refuse a deploy, how an operator
waives one, and what changed on the GPUs since a restart.

Pure: the facts come from remote/facts/gpu_health.py. A deploy restarts the engine onto the
host's GPUs; a GPU that fell off the bus, holds uncorrected ECC errors, waits for a page
retirement or row remap, has its memory taken by another process, or runs a driver the engine's
CUDA cannot use makes the new release fail to load (and its revert load onto the same bad GPU),
so preflight refuses it before anything changes, one line per GPU and cause.

The critical Xids are taken from NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/):
those whose documented action is a GPU reset, a reboot or a replacement (CRITICAL_XIDS); the
driver minimums from NVIDIA's CUDA Toolkit release notes (MIN_DRIVER).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# check name -> what it refuses (the names are what a waiver lists)
CHECKS: dict[str, str] = {
    "gpu_count": "fewer GPUs than the launch uses (TP x PP x DP)",
    "ecc": "uncorrected ECC errors since the driver loaded",
    "pending": "a page retirement or row remap waiting for a reset, or a failed remap",
    "xid": "a critical Xid in the kernel log since boot",
    "foreign_memory": "GPU memory held by a process that is not the service's",
    "driver": "a driver older than the engine's CUDA needs",
}

# Xids that mean the GPU needs a reset, a reboot or a replacement before it serves again, from
# NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/, "Xid Errors" table and its
# per-Xid pages). Application-caused ones (13 graphics engine exception, 31 memory page fault,
# 43 GPU stopped processing, 45 preemptive cleanup) are left out: a crashing engine logs them.
CRITICAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

# CUDA major -> the oldest driver branch that runs it (NVIDIA's CUDA Toolkit release notes,
# "CUDA Toolkit and Corresponding Driver Versions", minor version compatibility: 12.x >= 525,
# 13.x >= 580, 11.x >= 450).
MIN_DRIVER: dict[int, int] = {11: 450, 12: 525, 13: 580}

WAIVE_HINT = ("waive one check with --waive-gpu CHECK, vars.extra.gpu_waive in the inventory or "
              "gpu_health.waive in the playbook; checks: " + ", ".join(CHECKS))


@dataclass(frozen=True)
class Problem:
    check: str
    line: str                  # without the host's name
    gpu: int | None = None


def waiver_errors(value: object) -> str | None:
    """None when `value` is a list of check names, else what was expected (for a ConfigError)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return f"expected a list of GPU checks ({', '.join(CHECKS)})"
    unknown = [v for v in value if v not in CHECKS]
    if unknown:
        return f"unknown GPU check {unknown[0]!r} (known: {', '.join(CHECKS)})"
    return None


def gpus_needed(values: dict[str, str | None]) -> tuple[int, str] | None:
    """(GPUs one host needs, how) from the launch's dest -> value (None for a flag given without
    one): tp_size x pp_size x dp_size (dp replicas each take tp x pp GPUs; with
    --enable-dp-attention the dp ranks share the tp GPUs), over nnodes. None when it is one."""
    def num(name: str) -> int:
        raw = values.get(name)
        return int(raw) if raw is not None and str(raw).isdigit() and int(raw) > 0 else 1

    tp, pp, dp, nodes = num("tp_size"), num("pp_size"), num("dp_size"), num("nnodes")
    replicas = 1 if "enable_dp_attention" in values else dp
    total = tp * pp * replicas
    if total == 1:
        return None
    per_node = -(-total // nodes)
    how = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "") + (f" x DP {dp}" if replicas > 1 else "")
    how += f" over {nodes} nodes" if nodes > 1 else ""
    return per_node, how


def _gpu_name(index: int | None, bus: str) -> str:
    return f"GPU {index} ({bus})" if index is not None else f"GPU at {bus}"


def _when(at: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return time.strftime(fmt, time.localtime(at)) if at is not None else "an unknown time"


def _driver_major(driver: str) -> int | None:
    head = driver.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _cuda_major(cuda: str | None) -> int | None:
    head = (cuda or "").strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def problems(health: Any, need: tuple[int, str] | None, cuda: str | None, service: str) -> list[Problem]:
    """Every finding, one per GPU and cause, in check order. `health`: the gpu_health fact's
    GpuHealth (remote/facts/gpu_health.py; model/ reads it without importing remote/)."""
    out: list[Problem] = []
    if need is not None and len(health.gpus) < need[0]:
        out.append(Problem("gpu_count", f"nvidia-smi shows {len(health.gpus)} GPU(s); the launch uses {need[0]} "
                                        f"({need[1]})"))
    return [*out, *_memory(health), *_xids(health), *_foreign(health, service), *_driver(health, cuda)]


def _memory(health: Any) -> list[Problem]:
    out = [Problem("ecc", f"{_gpu_name(g.index, g.bus_id)}: {g.ecc_uncorrected} uncorrected ECC error(s) since the "
                          f"driver loaded", g.index) for g in health.gpus if g.ecc_uncorrected]
    out += [Problem("pending", f"{_gpu_name(g.index, g.bus_id)}: a page retirement is pending (it takes effect at "
                               f"the next driver reload)", g.index) for g in health.gpus if g.retired_pending]
    for r in health.remapped:
        index = health.index_of(r.pci)
        if r.failure:
            out.append(Problem("pending", f"{_gpu_name(index, r.bus_id)}: row remapping failed (NVIDIA: replace "
                                          f"the GPU)", index))
        elif r.pending:
            out.append(Problem("pending", f"{_gpu_name(index, r.bus_id)}: a row remap is pending (it takes effect "
                                          f"at the next GPU reset)", index))
    return out


def _xids(health: Any) -> list[Problem]:
    seen: dict[tuple[str, int], list[Any]] = {}
    for x in health.xids:
        if x.code in CRITICAL_XIDS:
            seen.setdefault((x.pci, x.code), []).append(x)
    buses = {g.pci: g.bus_id for g in health.gpus}
    out = []
    for (pci, code), events in seen.items():
        index, last = health.index_of(pci), events[-1]
        times = f"{len(events)} times, last at" if len(events) > 1 else "at"
        out.append(Problem("xid", f"{_gpu_name(index, buses.get(pci, pci))}: Xid {code} ({CRITICAL_XIDS[code]}) "
                                  f"{times} {_when(last.at)} in the kernel log since boot", index))
    return out


def _foreign(health: Any, service: str) -> list[Problem]:
    out = []
    for app in health.apps:
        if health.owned(app):
            continue
        index = health.index_of(app.pci)
        mem = f"{app.used_mib} MiB" if app.used_mib is not None else "memory"
        out.append(Problem("foreign_memory", f"{_gpu_name(index, app.bus_id)}: {mem} held by pid {app.pid} "
                                             f"({app.name or 'unknown'}), not a process of {service}", index))
    return out


def _driver(health: Any, cuda: str | None) -> list[Problem]:
    want = MIN_DRIVER.get(_cuda_major(cuda) or -1)
    if want is None:
        return []
    old = [d for d in sorted({g.driver for g in health.gpus}) if (_driver_major(d) or 0) < want]
    if not old:
        return []
    return [Problem("driver", f"driver {', '.join(old)} is older than the engine's CUDA {cuda} needs "
                              f"(driver {want} or newer)")]


def split(found: Iterable[Problem], waived: Iterable[str]) -> tuple[list[Problem], list[Problem]]:
    """(refused, waived) by the waived check names."""
    names = set(waived)
    found = list(found)
    return [p for p in found if p.check not in names], [p for p in found if p.check in names]


def column(found: Sequence[Problem]) -> str:
    """status's GPU cell: ok, or the causes in a few words (the lines go to the notes)."""
    if not found:
        return "ok"
    words = {"gpu_count": "missing GPUs", "ecc": "ECC", "pending": "pending remap", "xid": "Xid",
             "foreign_memory": "foreign process", "driver": "old driver"}
    parts: dict[str, list[str]] = {}
    for p in found:
        parts.setdefault(words[p.check], [])
        if p.gpu is not None and str(p.gpu) not in parts[words[p.check]]:
            parts[words[p.check]].append(str(p.gpu))
    return "; ".join(f"{w} on GPU {','.join(g)}" if g else w for w, g in parts.items())


def since(before: Any, after: Any) -> list[str]:
    """What appeared on the GPUs between two readings (a restart in between): new Xids (any code:
    a crash right after a restart is worth naming), more uncorrected ECC errors, a new pending
    retirement or remap, GPUs gone. One short phrase each, e.g. "Xid 79 on GPU 3 at 12:01:07"."""
    out: list[str] = []
    old = {(x.pci, x.code, x.at, x.text) for x in getattr(before, "xids", [])}
    for x in after.xids:
        if (x.pci, x.code, x.at, x.text) in old:
            continue
        index = after.index_of(x.pci)
        what = f" ({CRITICAL_XIDS[x.code]})" if x.code in CRITICAL_XIDS else ""
        where = f"GPU {index}" if index is not None else f"the GPU at {x.pci}"
        out.append(f"Xid {x.code}{what} on {where} at {_when(x.at, '%H:%M:%S')}")
    was = {g.uuid: g for g in getattr(before, "gpus", [])}
    for g in after.gpus:
        prev = was.get(g.uuid)
        if (g.ecc_uncorrected or 0) > ((prev.ecc_uncorrected or 0) if prev else 0):
            out.append(f"{g.ecc_uncorrected} uncorrected ECC error(s) on GPU {g.index}")
        if g.retired_pending and not (prev and prev.retired_pending):
            out.append(f"a page retirement pending on GPU {g.index}")
    was_remap = {r.pci: r for r in getattr(before, "remapped", [])}
    for r in after.remapped:
        prev_r = was_remap.get(r.pci)
        if (r.pending or r.failure) and not (prev_r and (prev_r.pending or prev_r.failure)):
            out.append(f"a row remap {'failure' if r.failure else 'pending'} on GPU {after.index_of(r.pci)}")
    gone = [g for uuid, g in was.items() if uuid not in {n.uuid for n in after.gpus}]
    for g in gone:
        out.append(f"GPU {g.index} ({g.bus_id}) no longer listed by nvidia-smi")
    return out

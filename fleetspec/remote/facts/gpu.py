"""GPUs as nvidia-smi reports them (`--format=csv,noheader,nounits`); "no GPU" without nvidia-smi."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

# compute_cap last: older drivers that do not know it make the whole query fail, so the command
# retries without it (parse takes 7 or 8 fields).
QUERY = "index,name,uuid,memory.total,memory.used,utilization.gpu,temperature.gpu,compute_cap"
QUERY_OLD = QUERY.rsplit(",", 1)[0]
NO_SMI = "__FLEETSPEC_NO_NVIDIA_SMI__"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_pct: int | None
    temperature_c: int | None
    compute_cap: str | None = None    # "9.0" for an H100/H200; what a CUDA kernel build must cover


@dataclass
class GpuInfo:
    present: bool                     # False: no nvidia-smi on the host
    gpus: list[Gpu] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.present:
            return "no GPU"
        return f"{len(self.gpus)} x {self.gpus[0].name}" if self.gpus else "0 GPUs"


def command() -> str:
    return (f"command -v nvidia-smi >/dev/null 2>&1 || {{ echo {NO_SMI}; exit 0; }}; "
            f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits 2>/dev/null || "
            f"nvidia-smi --query-gpu={QUERY_OLD} --format=csv,noheader,nounits")


def _num(text: str) -> int | None:
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A",):
        return None
    return int(float(text))


def parse(stdout: str) -> GpuInfo:
    if stdout.strip() == NO_SMI:
        return GpuInfo(present=False)
    gpus = []
    for row in csv.reader(io.StringIO(stdout), skipinitialspace=True):
        if not row:
            continue
        if len(row) not in (7, 8):
            raise ValueError(f"expected 7 or 8 CSV fields, got {len(row)}: {row!r}")
        idx, name, uuid, total, used, util, temp, *rest = (c.strip() for c in row)
        cap = rest[0] if rest and rest[0] and not rest[0].startswith("[") and rest[0] != "N/A" else None
        gpus.append(Gpu(int(idx), name, uuid, _num(total), _num(used), _num(util), _num(temp), cap))
    return GpuInfo(present=True, gpus=gpus)

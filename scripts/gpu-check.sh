#!/usr/bin/env bash
# One prepared run of the DDTree kernel's GPU checks, for a machine like those this project may be
# lent: a CUDA GPU (H200), CUDA 13 with nvcc, Python 3.12, torch 2.11.0+cu130 and transformers 5.x
# preinstalled, no network, only this repository carried (a few MiB). Nothing is installed or
# downloaded. It builds the kernel with nvcc, checks the CUDA kernel against the torch fallback
# on the GPU, times it against torch's logsumexp + topk on [128, 151936] bf16 and fp32 logits,
# and runs the real-attention tree verification on the GPU with a larger tiny Qwen3. One verdict
# line per check (PASS/FAIL name: ...); exit 0 only if every check passed. Budget: under 8 minutes.
# First, GPU health as fleetspec's preflight reads it (remote/facts/gpu_health.py, one command) on
# the real nvidia-smi and kernel log: the queries must be accepted and parse; what it finds is
# printed (INFO), and its raw output is kept as $OUT/gpu-health.txt, a capture for the fixtures.
# With it, the CUDA graph size each sglang version would pick from these GPUs' memory (the size
# fleetspec's graph sizing starts from, model/graphsize.py), as INFO.
#
#   bash scripts/gpu-check.sh            # results.json and the built library go to $OUT if set
#   GPU_CHECK_HEALTH_ONLY=1 bash scripts/gpu-check.sh   # the GPU health part alone
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | sed 's/^/INFO gpu: /'
command -v nvcc >/dev/null && nvcc --version | tail -1 | sed 's/^/INFO nvcc: /'
export PYTHONDONTWRITEBYTECODE=1
timeout 120 "$PY" - "${OUT:-}" <<'PYEOF'
import subprocess, sys
from fleetspec.model import gpuhealth, graphsize
from fleetspec.remote.facts import gpu_health
r = subprocess.run(["sh", "-c", gpu_health.command("")], capture_output=True, text=True, timeout=100)
if sys.argv[1]:
    with open(f"{sys.argv[1]}/gpu-health.txt", "w") as fh:
        fh.write(r.stdout)
try:
    h = gpu_health.parse(r.stdout)
except ValueError as err:
    print(f"FAIL gpu-health: nvidia-smi's output did not parse: {err}")
    sys.exit(1)
if not h.present:
    print("FAIL gpu-health: no nvidia-smi")
    sys.exit(1)
for p in gpuhealth.problems(h, None, None, "this machine"):
    print(f"INFO gpu-health finding [{p.check}]: {p.line}")
for u in h.unread:
    print(f"INFO gpu-health unread: {u}")
print(f"PASS gpu-health: {len(h.gpus)} GPU(s) ({', '.join(sorted({g.name for g in h.gpus}))}, driver "
      f"{', '.join(sorted({g.driver for g in h.gpus}))}), {len(h.remapped)} remap rows, {len(h.apps)} compute "
      f"app(s), kernel log: {h.kernel_log}, {len(h.xids)} Xid line(s)")
mems = [g.memory_total_mib for g in h.gpus if g.memory_total_mib]
if mems:
    for version in ("0.5.13.post1", "0.5.23"):
        sizes = ", ".join(f"TP {tp}: {graphsize.sglang_max_bs(version, min(mems), tp)}" for tp in (1, 2, 4, 8))
        print(f"INFO graph size sglang {version} picks for {min(mems)} MiB GPUs: {sizes}")
PYEOF
health=$?
[ -n "${GPU_CHECK_HEALTH_ONLY:-}" ] && exit $health
args=()
[ -n "${OUT:-}" ] && args+=(--out "$OUT")
timeout --signal=TERM --kill-after=10 470 "$PY" scripts/gpu_check.py "${args[@]}" "$@"
rc=$?
[ $rc -eq 124 ] && echo "FAIL gpu-check: stopped at the 470 s limit"
[ $rc -eq 0 ] && rc=$health
exit $rc

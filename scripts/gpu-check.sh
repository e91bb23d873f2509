#!/usr/bin/env bash
# One prepared run of the DDTree kernel's GPU checks, for a machine like those this project may be
# lent: a CUDA GPU (H200), CUDA 13 with nvcc, Python 3.12, torch 2.11.0+cu130 and transformers 5.x
# preinstalled, no network, only this repository carried (a few MiB). Nothing is installed or
# downloaded. It builds the kernel with nvcc, checks the CUDA kernel against the torch fallback
# on the GPU, times it against torch's logsumexp + topk on [128, 151936] bf16 and fp32 logits,
# and runs the real-attention tree verification on the GPU with a larger tiny Qwen3. One verdict
# line per check (PASS/FAIL name: ...); exit 0 only if every check passed. Budget: under 8 minutes.
#
#   bash scripts/gpu-check.sh            # results.json and the built library go to $OUT if set
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | sed 's/^/INFO gpu: /'
command -v nvcc >/dev/null && nvcc --version | tail -1 | sed 's/^/INFO nvcc: /'
export PYTHONDONTWRITEBYTECODE=1
args=()
[ -n "${OUT:-}" ] && args+=(--out "$OUT")
timeout --signal=TERM --kill-after=10 470 "$PY" scripts/gpu_check.py "${args[@]}" "$@"
rc=$?
[ $rc -eq 124 ] && echo "FAIL gpu-check: stopped at the 470 s limit"
exit $rc

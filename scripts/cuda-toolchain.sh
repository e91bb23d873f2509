#!/usr/bin/env bash
# Fetch what a CUDA build of the DDTree kernel needs on a machine without a GPU or CUDA: the CUDA
# build of torch (for its headers and the libraries the kernel links against) and NVIDIA's nvcc
# from pip (nvcc, crt, nvvm, cccl headers, cudart), unpacked under the cache. Nothing is installed
# into any python; nothing here is imported. Measured on the project's machine from its local
# mirror: ~630 MB of wheels in ~6 s, unpacked (~1.9 GB) in ~25 s; cached after the first run.
#
#   bash scripts/cuda-toolchain.sh [TORCH_VERSION [CUDA_PIP_VERSION]]    # default 2.11.0 13.0
# prints the two folders for: fleetspec kernels build --cuda --arch 9.0 --torch-root T --cuda-home C
set -euo pipefail
TORCH=${1:-2.11.0}
CUDA=${2:-13.0}
case "$CUDA" in
  13.0) NVCC=13.0.88 CRT=13.0.88 NVVM=13.0.88 CCCL=13.0.85 RT=13.0.96 SUFFIX="" ;;
  *) echo "cuda-toolchain.sh: no pinned nvcc wheels for CUDA $CUDA (13.0 only)" >&2; exit 2 ;;
esac
CACHE=${FLEETSPEC_CACHE:-/var/cache/fleetspec}/cuda-toolchain
DEST="$CACHE/torch-$TORCH-cuda$CUDA"
if [ -f "$DEST/.complete" ]; then
  echo "torch_root=$DEST/torch-wheel"; echo "cuda_home=$DEST/cuda/nvidia/cu13"; exit 0
fi
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
py=${PYTHON:-python3}
"$py" -m pip download -q --no-deps -d "$work/wheels" --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 "torch==$TORCH" 2>&1 | grep -v "is ignored" || true
"$py" -m pip download -q --no-deps -d "$work/wheels" "nvidia-cuda-nvcc==$NVCC" "nvidia-cuda-crt==$CRT" \
  "nvidia-nvvm==$NVVM" "nvidia-cuda-cccl==$CCCL" "nvidia-cuda-runtime==$RT" 2>&1 | grep -v "is ignored" || true
ls "$work"/wheels/torch-"$TORCH"-*.whl >/dev/null
"$py" - "$work" <<'PY'
import sys, zipfile, pathlib
work = pathlib.Path(sys.argv[1])
for whl in sorted((work / "wheels").glob("*.whl")):
    dest = work / ("torch-wheel" if whl.name.startswith("torch-") else "cuda")
    with zipfile.ZipFile(whl) as z:
        members = [m for m in z.namelist() if not whl.name.startswith("torch-")
                   or m.startswith(("torch/include/", "torch/lib/", "torch/version.py", "torch/utils/cpp_extension.py"))
                   or m.endswith(".dist-info/WHEEL")]
        z.extractall(dest, members)
for f in (work / "cuda").rglob("*"):
    if f.is_file() and (f.parent.name == "bin" or "nvvm/bin" in str(f)):
        f.chmod(0o755)
PY
rm -rf "$work/wheels"
touch "$work/.complete"
rm -rf "$DEST"
mv "$work" "$DEST"
trap - EXIT
echo "torch_root=$DEST/torch-wheel"; echo "cuda_home=$DEST/cuda/nvidia/cu13"

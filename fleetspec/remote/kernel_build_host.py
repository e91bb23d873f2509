"""The on-host kernel build's program (`fleetspec kernels build --on HOST`), run in the host's python."""

from __future__ import annotations

# Runs on the host as `python -c` (files.run_python) with argv: scratch folder, arch list ("" = CPU).
# Compiles directly with the host's c++ (and nvcc), the flags torch.utils.cpp_extension uses, so
# neither ninja nor setuptools is needed there. Prints one JSON line: the ABI and the library, or
# an error naming what is missing.
REMOTE_BUILD = r'''
import json, os, shutil, subprocess, sys, sysconfig
work, arch = sys.argv[1], sys.argv[2]
def done(**kw):
    print(json.dumps(kw)); sys.exit(0)
spec = json.load(open(os.path.join(work, "kernel.json")))
try:
    import torch
    from torch.utils import cpp_extension
except Exception as err:
    done(error="no torch in %s (%s: %s)" % (sys.executable, type(err).__name__, err))
cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
if not cxx:
    done(error="no C++ compiler (c++ or g++) on its PATH; install g++ (Debian: build-essential)")
archs = [a for a in arch.replace(";", " ").split() if a]
nvcc = os.path.join(cpp_extension.CUDA_HOME or "", "bin", "nvcc")
if archs and not torch.version.cuda:
    done(error="its torch %s is a CPU build; a CUDA build needs a CUDA torch" % torch.__version__)
if archs and not os.path.isfile(nvcc):
    done(error="no nvcc (CUDA_HOME unset and none on PATH) for its CUDA %s torch" % torch.version.cuda)
abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
std = "-std=c++20" if "-std=c++20" in open(cpp_extension.__file__).read() else "-std=c++17"
def paths(fn):
    try:
        return fn(device_type="cuda" if archs else "cpu")
    except TypeError:
        return fn(bool(archs))
inc = ["-I" + p for p in paths(cpp_extension.include_paths)]
flags = ["-O3", std, "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-DTORCH_EXTENSION_NAME=%s" % spec["library"]]
jobs, objs = [], []
for s in spec["sources"]:
    objs.append(os.path.join(work, s + ".o"))
    jobs.append([cxx, "-c", os.path.join(work, s), "-o", objs[-1], "-fPIC"] + flags + inc)
for s in spec.get("cuda_sources", []) if archs else []:
    objs.append(os.path.join(work, s + ".o"))
    gencode = ["-gencode=arch=compute_%s,code=sm_%s" % ((a.split("+")[0].replace(".", ""),) * 2) for a in archs]
    jobs.append([nvcc, "-c", os.path.join(work, s), "-o", objs[-1], "-Xcompiler", "-fPIC",
                 "--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                 "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"] + gencode + flags + inc)
lib = os.path.join(work, spec["name"] + ".so")
libs = ["-lc10", "-ltorch_cpu", "-ltorch"] + (["-lc10_cuda", "-ltorch_cuda", "-lcudart"] if archs else [])
link = [cxx, "-shared", "-o", lib] + objs + ["-L" + p for p in paths(cpp_extension.library_paths)] + libs
for job in jobs + [link]:
    r = subprocess.run(job, capture_output=True, text=True)
    if r.returncode != 0:
        tail = [l for l in (r.stderr or r.stdout).strip().splitlines() if l.strip()][-3:]
        done(error="%s failed (exit %d): %s" % (os.path.basename(job[0]), r.returncode, " | ".join(tail)))
done(library=lib, abi={"python_tag": "cp%d%d" % sys.version_info[:2], "torch": torch.__version__,
     "cuda": torch.version.cuda if archs else "cpu", "cxx11_abi": bool(abi),
     "platform": sysconfig.get_platform().replace("-", "_").replace(".", "_"), "arch_list": archs})
'''

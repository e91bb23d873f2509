"""The on-host kernel build's program (`fleetspec kernels build --on HOST`), run in the host's python."""

from __future__ import annotations

# Runs on the host as `python -c` (files.run_python) with argv: scratch folder, arch list ("" = CPU),
# after the source of fleetspec/build/compile_flags.py (build/kernel_on_host.py joins the two), whose
# functions write the command lines. Compiles directly with the host's c++ (and nvcc), so neither
# ninja nor setuptools is needed there. Prints one JSON line: the ABI and the library, or an error
# naming what is missing.
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
archs = arch_list(arch)
nvcc = os.path.join(cpp_extension.CUDA_HOME or "", "bin", "nvcc")
if archs and not torch.version.cuda:
    done(error="its torch %s is a CPU build; a CUDA build needs a CUDA torch" % torch.__version__)
if archs and not os.path.isfile(nvcc):
    done(error="no nvcc (CUDA_HOME unset and none on PATH) for its CUDA %s torch" % torch.version.cuda)
abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
def paths(fn):
    try:
        return fn(device_type="cuda" if archs else "cpu")
    except TypeError:
        return fn(bool(archs))
jobs = compile_jobs(spec, work, work, cxx=cxx, nvcc=nvcc, std=cxx_std(open(cpp_extension.__file__).read()),
                    cxx11_abi=abi, includes=paths(cpp_extension.include_paths), archs=archs)
lib = os.path.join(work, spec["name"] + ".so")
link = link_command(spec, work, lib, cxx=cxx, library_dirs=paths(cpp_extension.library_paths), cuda=bool(archs))
for job in jobs + [link]:
    r = subprocess.run(job, capture_output=True, text=True)
    if r.returncode != 0:
        tail = [l for l in (r.stderr or r.stdout).strip().splitlines() if l.strip()][-3:]
        done(error="%s failed (exit %d): %s" % (os.path.basename(job[0]), r.returncode, " | ".join(tail)))
done(library=lib, abi={"python_tag": "cp%d%d" % sys.version_info[:2], "torch": torch.__version__,
     "cuda": torch.version.cuda if archs else "cpu", "cxx11_abi": abi,
     "platform": sysconfig.get_platform().replace("-", "_").replace(".", "_"), "arch_list": archs})
'''

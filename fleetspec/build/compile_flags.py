"""The compiler and linker command lines of a kernel build: the flags torch.utils.cpp_extension uses,
written once for every place that compiles (build/kernel.py's offline nvcc build, the on-host build
in remote/kernel_build_host.py, scripts/gpu_check.py). Standard library only and no fleetspec
imports: the on-host build sends this module's source to the host's python, and gpu_check loads it
by path.
"""

from __future__ import annotations

import os

NVCC_FLAGS = ["-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__",
              "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
OPTIMIZE = ["-O3"]   # every compile, C++ and CUDA, as cpp_extension.load is asked for too
TORCH_LIBS = ["-lc10", "-ltorch_cpu", "-ltorch"]
TORCH_CUDA_LIBS = ["-lc10_cuda", "-ltorch_cuda"]


def arch_list(text: str) -> list[str]:
    """'8.0;9.0+PTX' (TORCH_CUDA_ARCH_LIST's form; spaces and commas too) as ['8.0', '9.0+PTX']."""
    return [a for a in text.replace(";", " ").replace(",", " ").split() if a]


def bad_arch(archs: list[str]) -> str | None:
    """The first entry that is not a compute capability such as '9.0' or '9.0+PTX', else None."""
    for a in archs:
        if not a.removesuffix("+PTX").replace(".", "").isdigit():
            return a
    return None


def gencode(archs: list[str]) -> list[str]:
    """nvcc's -gencode flags: machine code (sm_XY) for each capability, and with `+PTX` also PTX
    (compute_XY), which newer GPUs compile at load, as cpp_extension does for TORCH_CUDA_ARCH_LIST."""
    out = []
    for a in archs:
        cc = a.removesuffix("+PTX").replace(".", "")
        out.append(f"-gencode=arch=compute_{cc},code=sm_{cc}")
        if a.endswith("+PTX"):
            out.append(f"-gencode=arch=compute_{cc},code=compute_{cc}")
    return out


def cxx_std(cpp_extension_source: str) -> str:
    """The C++ standard the torch at hand builds extensions with (read from its cpp_extension.py)."""
    return "-std=c++20" if "-std=c++20" in cpp_extension_source else "-std=c++17"


def compile_jobs(spec: dict, source_dir: str, work: str, *, cxx: str, nvcc: str | None, std: str,
                 cxx11_abi: bool, includes: list[str], archs: list[str]) -> list[list[str]]:
    """One command per source: `sources` with `cxx`, and, for a CUDA build (`archs` not empty),
    `cuda_sources` with `nvcc`. Objects are written to `work` as <source>.o (objects())."""
    common = [*OPTIMIZE, std, f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}", f"-DTORCH_EXTENSION_NAME={spec['library']}"]
    inc = [f"-I{p}" for p in includes]
    jobs = [[cxx, "-c", os.path.join(source_dir, s), "-o", os.path.join(work, s + ".o"), "-fPIC", *common, *inc]
            for s in spec["sources"]]
    if archs:
        if not nvcc:
            raise ValueError("a CUDA build needs nvcc")
        jobs += [[nvcc, "-c", os.path.join(source_dir, s), "-o", os.path.join(work, s + ".o"), *NVCC_FLAGS,
                  *gencode(archs), *common, *inc] for s in spec.get("cuda_sources", [])]
    return jobs


def objects(spec: dict, work: str, cuda: bool) -> list[str]:
    return [os.path.join(work, s + ".o") for s in [*spec["sources"], *(spec.get("cuda_sources", []) if cuda else [])]]


def link_command(spec: dict, work: str, library: str, *, cxx: str, library_dirs: list[str], cuda: bool,
                 cudart: str = "-lcudart", rpath: bool = False) -> list[str]:
    """The shared library from compile_jobs' objects, linked against torch (and CUDA's runtime:
    `cudart` is the -l flag naming it)."""
    libs = TORCH_LIBS + (TORCH_CUDA_LIBS + [cudart] if cuda else [])
    return [cxx, "-shared", "-o", library, *objects(spec, work, cuda), *[f"-L{p}" for p in library_dirs], *libs,
            *([f"-Wl,-rpath,{p}" for p in library_dirs] if rpath else [])]

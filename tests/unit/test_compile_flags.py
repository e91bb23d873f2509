"""One set of compiler command lines for every kernel build (build/compile_flags.py): the offline
nvcc build, the on-host build and scripts/gpu_check.py take them from there, `+PTX` included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fleetspec.build import compile_flags as flags
from fleetspec.build.kernel_on_host import program

REPO = Path(__file__).resolve().parents[2]
SPEC = json.loads((REPO / "playbooks/ddtree/kernels/tree_mask/kernel.json").read_text())


def _jobs(archs):
    return flags.compile_jobs(SPEC, "/src", "/w", cxx="c++", nvcc="/cuda/bin/nvcc", std="-std=c++17",
                              cxx11_abi=True, includes=["/inc"], archs=archs)


def test_ptx_is_added_only_where_asked():
    assert flags.gencode(["8.0", "9.0+PTX"]) == ["-gencode=arch=compute_80,code=sm_80",
                                                 "-gencode=arch=compute_90,code=sm_90",
                                                 "-gencode=arch=compute_90,code=compute_90"]
    assert flags.arch_list("8.0;9.0+PTX, 10.0") == ["8.0", "9.0+PTX", "10.0"]
    assert flags.bad_arch(["9.0", "9.0+ptx"]) == "9.0+ptx" and flags.bad_arch(["9.0+PTX"]) is None


def test_a_cuda_build_compiles_each_cuda_source_with_nvcc_and_the_rest_with_cxx():
    jobs = _jobs(["9.0+PTX"])
    nvcc = [j for j in jobs if j[0] == "/cuda/bin/nvcc"]
    assert [Path(j[2]).name for j in nvcc] == SPEC["cuda_sources"]
    assert all("-gencode=arch=compute_90,code=compute_90" in j and "-I/inc" in j for j in nvcc)
    cxx = [j for j in jobs if j[0] == "c++"]
    assert [Path(j[2]).name for j in cxx] == SPEC["sources"]
    assert not any(a.startswith("-gencode") for j in cxx for a in j)
    assert all("-D_GLIBCXX_USE_CXX11_ABI=1" in j and "-DTORCH_EXTENSION_NAME=fleetspec_ddtree" in j for j in jobs)
    assert [j[0] for j in _jobs([])] == ["c++"] * len(SPEC["sources"])      # a CPU build: no nvcc at all
    link = flags.link_command(SPEC, "/w", "/w/t.so", cxx="c++", library_dirs=["/lib"], cuda=True, cudart="-l:libcudart.so.13")
    assert link[link.index("-o") + 1] == "/w/t.so" and "-l:libcudart.so.13" in link and "-lc10_cuda" in link
    assert [a for a in link if a.endswith(".o")] == flags.objects(SPEC, "/w", cuda=True)


def test_the_flags_are_written_nowhere_else():
    """Every build takes its -gencode and nvcc flags from compile_flags: no copy to drift."""
    copies = [p for p in [*REPO.glob("fleetspec/**/*.py"), *REPO.glob("scripts/*.py")]
              if p.name != "compile_flags.py" and ("-gencode" in p.read_text() or "expt-relaxed-constexpr" in p.read_text())]
    assert copies == []


def test_it_loads_by_path_without_fleetspec_and_heads_the_on_host_program():
    """gpu_check loads the module by path and the on-host build runs it in the host's python: it
    needs nothing but the standard library."""
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('f', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); print(m.gencode(['9.0+PTX'])[-1])")
    done = subprocess.run([sys.executable, "-I", "-c", code, str(REPO / "fleetspec/build/compile_flags.py")],
                          capture_output=True, text=True, cwd="/", timeout=60)
    assert done.stdout.strip() == "-gencode=arch=compute_90,code=compute_90", done.stderr
    text = program()
    assert text.startswith(Path(flags.__file__).read_text()) and "compile_jobs(" in text
    compile(text, "<on-host build>", "exec")

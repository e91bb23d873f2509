"""The GPU checks of the DDTree kernel, run by scripts/gpu-check.sh on a machine with a CUDA GPU,
nvcc and a CUDA build of torch (no network, nothing installed). One verdict line per check:

  build      compile tree_mask.cpp, topk_logprobs.cpp and the two .cu files with nvcc for this GPU
  equality   the CUDA kernel against a stable-sort reference and the torch fallback (ties, -inf,
             fp32/bf16/fp16, Qwen's vocabulary) and identical trees with and without it, on the GPU
  timing     fused kernel vs torch logsumexp + topk on [128, 151936] bf16 and fp32 logits
  attention  DDTree verification through a tiny Qwen3's real attention on the GPU (larger model)

    python3 scripts/gpu_check.py [--out DIR] [--skip-attention]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "playbooks/ddtree/kernels/tree_mask"
PAYLOAD = REPO / "playbooks/ddtree/payload/ddtree_utils.py"
FLAGS = REPO / "fleetspec/build/compile_flags.py"
RESULTS: dict = {}


def verdict(name: str, ok: bool, text: str, **data) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {text}", flush=True)
    RESULTS[name] = {"ok": ok, "text": text, **data}
    return ok


def payload():
    os.environ["FLEETSPEC_DDTREE_KERNEL"] = "cuda"     # the CUDA kernel is opt-in in the payload; here it is the subject
    spec = importlib.util.spec_from_file_location("ddtree_utils_gpu", PAYLOAD)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run(cmd: list[str], timeout: int) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {done.returncode}): "
                           + " | ".join((done.stderr or done.stdout).strip().splitlines()[-8:]))


def compile_flags():
    """fleetspec/build/compile_flags.py, loaded by path: the command lines every kernel build uses."""
    spec = importlib.util.spec_from_file_location("fleetspec_compile_flags", FLAGS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(work: Path) -> Path:
    """nvcc for the .cu files, c++ for the .cpp files, linked against this torch, with the command
    lines a shipped build uses (compile_flags), without needing ninja."""
    import torch
    from torch.utils import cpp_extension

    flags = compile_flags()
    major, minor = torch.cuda.get_device_capability()
    cuda_home = cpp_extension.CUDA_HOME or os.environ.get("CUDA_HOME")
    nvcc = shutil.which("nvcc") or (cuda_home and str(Path(cuda_home) / "bin/nvcc"))
    if not nvcc or not Path(nvcc).exists():
        raise RuntimeError("no nvcc on PATH or under CUDA_HOME")
    spec = json.loads((SOURCE / "kernel.json").read_text())
    jobs = flags.compile_jobs(spec, str(SOURCE), str(work), cxx="c++", nvcc=nvcc,
                              std=flags.cxx_std(inspect.getsource(cpp_extension)),
                              cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
                              includes=cpp_extension.include_paths(device_type="cuda"), archs=[f"{major}.{minor}"])
    procs = [subprocess.Popen(j, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for j in jobs]
    for job, proc in zip(jobs, procs, strict=True):
        out, err = proc.communicate(timeout=400)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(job[2]).name}: {Path(job[0]).name} failed: "
                               + " | ".join((err or out).strip().splitlines()[-8:]))
    library = work / "tree_mask.so"
    run(flags.link_command(spec, str(work), str(library), cxx="c++", cuda=True, rpath=True,
                           library_dirs=cpp_extension.library_paths(device_type="cuda")), 120)
    return library


def check_build(work: Path) -> Path | None:
    import torch

    began = time.monotonic()
    try:
        library = build(work)
    except Exception as err:                  # one verdict line, never a traceback
        verdict("build", False, f"{type(err).__name__}: {err}")
        return None
    major, minor = torch.cuda.get_device_capability()
    verdict("build", True, f"{library.name} for sm_{major}{minor} with nvcc, torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}) in {time.monotonic() - began:.0f} s")
    return library


def reference(x, k):
    import torch

    logits = x.float().cpu()
    values, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[..., :k] - torch.logsumexp(logits, dim=-1, keepdim=True), ids[..., :k]


def _candidate_cases(g):
    """Logits that stress the top-k: random, ties, -inf rows, half precisions, a Qwen-sized vocab."""
    import torch

    rand = torch.randn(16, 4099, generator=g) * 3
    ties = (torch.randn(6, 777, generator=g) * 1.5).round()
    minf = torch.randn(4, 300, generator=g)
    minf[0] = float("-inf")
    minf[1, 5:] = float("-inf")
    minf[2, ::2] = float("-inf")
    qwen = torch.randn(8, 151_936, generator=g) * 3
    return [("random", rand, 64), ("random-k1", rand, 1), ("random-k2048", rand, 2048), ("ties", ties, 40),
            ("ties-all", ties, 777), ("flat", torch.zeros(3, 50), 7), ("-inf", minf, 10), ("-inf-all", minf, 300),
            ("bf16", qwen.bfloat16(), 64), ("fp16", ties.half(), 33), ("qwen", qwen, 64)]


def _candidate_differences(du, cases, dev) -> list[str]:
    import torch

    bad = []
    for name, x, k in cases:
        want_v, want_i = reference(x, k)
        got_v, got_i, path = du._candidates(x.to(dev), k, use_kernel=True)
        fb_v, fb_i, _ = du._candidates(x.to(dev), k, use_kernel=False)
        cpu_v, cpu_i, _ = du._candidates(x, k, use_kernel=True)
        if path != "kernel:cuda":
            bad.append(f"{name}: path {path}")
        if not torch.equal(got_i.cpu(), want_i):
            bad.append(f"{name}: CUDA ids differ from the stable sort")
        if not torch.equal(fb_i.cpu(), want_i):
            bad.append(f"{name}: fallback ids differ from the stable sort")
        if not torch.equal(cpu_i, want_i):
            bad.append(f"{name}: CPU kernel ids differ")
        if not torch.allclose(got_v.cpu(), fb_v.cpu(), rtol=0, atol=1e-5, equal_nan=True):
            bad.append(f"{name}: logp differs by {(got_v.cpu() - fb_v.cpu()).abs().nan_to_num().max().item():.2e}")
    return bad


def _tree_differences(du, g, dev) -> tuple[list[str], int]:
    """Trees built by the CUDA kernel, the torch fallback and the CPU kernel must be equal."""
    import torch

    bad, trees = [], 0
    for batch, depth, vocab, budget, cap in [(8, 15, 151_936, 64, None), (4, 7, 1000, 32, 4), (2, 9, 512, 100, 8)]:
        for variant in ("normal", "ties", "minf", "bf16"):
            x = torch.randn(batch, depth, vocab, generator=g) * 3
            if variant == "ties":
                x = x.round()
            elif variant == "minf":
                x[:, -1, vocab // 3:] = float("-inf")
            elif variant == "bf16":
                x = x.bfloat16()
            a = du.build_ddtree(x.to(dev), budget, cap, use_kernel=True)
            b = du.build_ddtree(x.to(dev), budget, cap, use_kernel=False)
            c = du.build_ddtree(x, budget, cap, use_kernel=True)
            for f in ("tokens", "parents", "depth", "valid"):
                if not (torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu()) and torch.equal(getattr(a, f).cpu(), getattr(c, f))):
                    bad.append(f"tree {variant} {batch}x{depth}x{vocab}: {f} differs")
            mask = torch.ops.fleetspec_ddtree.tree_mask(a.parents)
            if not torch.equal(mask.cpu(), du.visibility_mask(a).cpu()):
                bad.append(f"tree {variant}: tree_mask differs")
            trees += 1
    return bad, trees


def check_equality(du) -> bool:
    import torch

    dev = "cuda"
    g = torch.Generator().manual_seed(3)
    cases = _candidate_cases(g)
    bad = _candidate_differences(du, cases, dev)
    tree_bad, trees = _tree_differences(du, g, dev)
    bad += tree_bad
    return verdict("equality", not bad, f"{len(cases)} candidate cases, {trees} trees (CUDA kernel vs stable sort, "
                   f"torch fallback, CPU kernel)" + (": " + "; ".join(bad[:6]) if bad else ": identical"))


def check_timing(du) -> bool:
    import torch

    out = []
    ok = True
    for dtype in (torch.bfloat16, torch.float32):
        x = (torch.randn(128, 151_936, device="cuda") * 3).to(dtype)

        def fused(x=x):
            return torch.ops.fleetspec_ddtree.topk_logprobs(x, 64)

        def plain(x=x):
            logits = x.float()
            values, ids = torch.topk(logits, 64, dim=-1)
            return values - torch.logsumexp(logits, dim=-1, keepdim=True), ids

        def plain_native(x=x):
            values, ids = torch.topk(x, 64, dim=-1)
            return values.float() - torch.logsumexp(x.float(), dim=-1, keepdim=True), ids

        times = {}
        for name, fn in (("fused", fused), ("torch", plain), ("torch_native", plain_native)):
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            runs = []
            for _ in range(30):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                runs.append(start.elapsed_time(end))
            times[name] = statistics.median(runs)
        best_torch = min(times["torch"], times["torch_native"])
        ok &= times["fused"] <= best_torch
        bytes_read = x.numel() * x.element_size()
        out.append(f"{str(dtype).removeprefix('torch.')}: fused {times['fused'] * 1e3:.0f} us "
                   f"({bytes_read / times['fused'] / 1e6:.0f} GB/s of logits) vs torch logsumexp+topk "
                   f"{best_torch * 1e3:.0f} us ({best_torch / times['fused']:.2f}x)")
        RESULTS.setdefault("timing_ms", {})[str(dtype)] = times
    return verdict("timing", ok, "[128, 151936], k=64: " + "; ".join(out))


def check_attention(timeout: int) -> bool:
    script = REPO / "tests/unit/test_ddtree_attention.py"
    try:
        # the repository on the path: a GPU machine has this checkout, not an installed fleetspec
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        done = subprocess.run([sys.executable, str(script), "--device", "cuda", "--size", "large"],
                              capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": path})
    except subprocess.TimeoutExpired:
        return verdict("attention", False, f"did not finish within {timeout} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    if not lines:
        return verdict("attention", False, "no verdict: " + " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:]))
    return verdict("attention", done.returncode == 0 and lines[-1].startswith("PASS"), lines[-1].split(" ", 1)[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write results.json and the built library here")
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--attention-timeout", type=int, default=240)
    args = ap.parse_args()
    began = time.monotonic()
    try:
        import torch
    except ImportError as err:
        verdict("torch", False, str(err))
        return 1
    if not torch.cuda.is_available():
        verdict("gpu", False, f"torch {torch.__version__} sees no CUDA GPU")
        return 1
    print(f"INFO {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))}), "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}, python {sys.version.split()[0]}", flush=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="fleetspec-gpu-check-") as work:
        library = check_build(Path(work))
        if library is None:
            ok = False
        else:
            du = payload()
            status = du.load_kernel(library)
            if not verdict("load", status["loaded"] and "cuda" in status["devices"],
                           f"devices {status['devices']}" + (f", error {status['error']}" if status["error"] else "")):
                ok = False
            else:
                for check in (check_equality, check_timing):
                    try:
                        ok &= check(du)
                    except Exception as err:
                        ok &= verdict(check.__name__.removeprefix("check_"), False,
                                      f"{type(err).__name__}: {err} | {traceback.format_exc(limit=2).splitlines()[-2].strip()}")
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(library, args.out / "tree_mask.so")
    if not args.skip_attention:
        ok &= check_attention(args.attention_timeout)
    print(f"{'PASS' if ok else 'FAIL'} gpu-check: all checks in {time.monotonic() - began:.0f} s", flush=True)
    if args.out:
        (args.out / "results.json").write_text(json.dumps(RESULTS, indent=2, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""DDTree tree building on this CPU, side by side in one run, same logits, same trees (checked):

- build_ddtree with the compiled kernel (fused top-k + log-normaliser, one pass over the logits),
- one plain memory pass over the same logits (`logits.sum()`): the floor the kernel is held to,
- the torch log_softmax + topk path, then the same heap,
- today's build before the kernel (torch topk + logsumexp, then the heap),
- the torch fallback that ships with the kernel (today's, plus ties ordered by token id),
- with --reference, a straightforward Python-heap version (full sort of every position).

Shape: batch 8, budget 64, block 16 (15 drafted positions after the bonus token), vocab 151,936
(Qwen's). The kernel is built (or taken from the cache) with fleetspec's kernel builder.

    python bench/tree_build.py [--repeats 7] [--threads N] [--topk-cap N] [--reference]
"""

from __future__ import annotations

import argparse
import heapq
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def load_payload():
    from fleetspec.model import payload

    return payload.load("ddtree_utils", "ddtree_utils_bench")


def reference_build(draft_logits: torch.Tensor, budget: int, topk_cap: int | None = None):
    """Best-first DDTree growth with no pruning: sort every position's whole vocabulary."""
    batch, depth_count, vocab = draft_logits.shape
    logp = torch.log_softmax(draft_logits.float(), dim=-1)
    sorted_logp, sorted_ids = torch.sort(logp, dim=-1, descending=True)
    k = min(vocab, topk_cap or vocab)
    trees = []
    for b in range(batch):
        parents, tokens, scores = [-1], [-1], [0.0]
        heap = [(-float(sorted_logp[b, 0, 0]), 0, 0, 0, 0)]
        order = 1
        while heap and len(parents) <= budget:
            neg, _, d, r, p = heapq.heappop(heap)
            node = len(parents)
            parents.append(p)
            tokens.append(int(sorted_ids[b, d, r]))
            scores.append(-neg)
            if r + 1 < k:
                heapq.heappush(heap, (-(scores[p] + float(sorted_logp[b, d, r + 1])), order, d, r + 1, p))
                order += 1
            if d + 1 < depth_count:
                heapq.heappush(heap, (neg - float(sorted_logp[b, d + 1, 0]), order, d + 1, 0, node))
                order += 1
        trees.append((parents, tokens))
    return trees


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def heap_build(du, logp: torch.Tensor, ids: torch.Tensor, budget: int):
    """build_ddtree's heap half on given candidates (so every path shares it)."""
    rows_p, rows_i = logp.tolist(), ids.tolist()
    return [du._grow(rows_p[b], rows_i[b], budget) for b in range(len(rows_p))]


def today_candidates(logits: torch.Tensor, k: int):
    """build_ddtree's candidates before the kernel: topk, then logsumexp (ties in topk's order)."""
    x = logits.float()
    values, ids = torch.topk(x, k, dim=-1)
    return values - torch.logsumexp(x, dim=-1, keepdim=True), ids


def log_softmax_candidates(logits: torch.Tensor, k: int):
    """The obvious torch path: a full log_softmax, then topk."""
    return torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)


def cpu_isa() -> str:
    """The CPU's vector ISA as the kernel picks its build (avx512f, avx2+fma, else baseline), torch's
    own pick, and the CPU's model name, from /proc/cpuinfo."""
    flags, model = set(), "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            elif key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
    except OSError:
        pass
    kernel = "avx512f" if "avx512f" in flags else "avx2+fma" if {"avx2", "fma"} <= flags else "baseline"
    return f"kernel ISA {kernel}, torch ISA {torch.backends.cpu.get_cpu_capability()}, {model}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--topk-cap", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--reference", action="store_true", help="also time the full-sort Python heap (slow)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO))
    from fleetspec.build.kernel import build_kernel

    du = load_payload()
    kernel, _ = build_kernel(REPO / "playbooks/ddtree/kernels/tree_mask")
    status = du.load_kernel(kernel.path)
    if not status["loaded"]:
        raise SystemExit(f"kernel did not load: {status['error']}")
    depth = args.block - 1
    logits = torch.randn(args.batch, depth, args.vocab, generator=torch.Generator().manual_seed(0)) * 3
    k = min(args.budget, args.vocab, args.topk_cap or args.vocab)

    tree = du.build_ddtree(logits, args.budget, args.topk_cap, use_kernel=True)
    fallback = du.build_ddtree(logits, args.budget, args.topk_cap, use_kernel=False)
    assert tree.candidates == "kernel:cpu" and fallback.candidates == "torch:cpu"
    for f in ("tokens", "parents", "depth", "valid"):
        assert torch.equal(getattr(tree, f), getattr(fallback, f)), f"kernel and fallback trees differ in {f}"
    for name, fn in (("today", today_candidates), ("log_softmax", log_softmax_candidates)):
        for b, (parents, tokens, _, _) in enumerate(heap_build(du, *fn(logits, k), args.budget)):
            assert tree.parents[b, : len(parents)].tolist() == parents, f"{name} row {b}: parents differ"
            assert tree.tokens[b, 1: len(tokens)].tolist() == tokens[1:], f"{name} row {b}: tokens differ"
    if args.reference:
        for b, (parents, tokens) in enumerate(reference_build(logits, args.budget, args.topk_cap)):
            assert tree.parents[b, : len(parents)].tolist() == parents, f"row {b}: parents differ"
            assert tree.tokens[b, 1: len(tokens)].tolist() == tokens[1:], f"row {b}: tokens differ"

    runs = {
        "kernel": lambda: du.build_ddtree(logits, args.budget, args.topk_cap, use_kernel=True),
        "sum": lambda: logits.sum(),
        "log_softmax": lambda: heap_build(du, *log_softmax_candidates(logits, k), args.budget),
        "today": lambda: heap_build(du, *today_candidates(logits, k), args.budget),
        "fallback": lambda: du.build_ddtree(logits, args.budget, args.topk_cap, use_kernel=False),
        "kernel_candidates": lambda: du._candidates(logits, k, use_kernel=True),
    }
    times = {name: [] for name in runs}
    for _ in range(args.repeats):          # interleaved, so load from elsewhere hits every path alike
        for name, fn in runs.items():
            times[name].extend(timed(fn, 1))
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"tree build: batch {args.batch}, budget {args.budget}, block {args.block} ({depth} drafted positions), "
          f"vocab {args.vocab:,}, topk_cap {args.topk_cap}, torch {torch.__version__}, "
          f"median of {args.repeats} interleaved runs; same trees: checked")
    print(f"  {torch.get_num_threads()} threads ({os.cpu_count()} CPUs), {cpu_isa()}")
    print(f"  build_ddtree with the kernel:          {med['kernel'] * 1e3:8.1f} ms  "
          f"(kernel candidates alone {med['kernel_candidates'] * 1e3:.1f} ms)")
    print(f"  one sum pass over the logits:          {med['sum'] * 1e3:8.1f} ms  -> kernel build / sum = "
          f"{med['kernel'] / med['sum']:.2f}x (target <= 3x)")
    print(f"  torch log_softmax + topk, then heap:   {med['log_softmax'] * 1e3:8.1f} ms  -> "
          f"{med['log_softmax'] / med['kernel']:.1f}x the kernel build")
    print(f"  today's build (topk + logsumexp):      {med['today'] * 1e3:8.1f} ms  -> "
          f"{med['today'] / med['kernel']:.1f}x the kernel build")
    print(f"  torch fallback (ties by token id):     {med['fallback'] * 1e3:8.1f} ms  -> "
          f"{med['fallback'] / med['kernel']:.1f}x the kernel build")
    if args.reference:
        ref = statistics.median(timed(lambda: reference_build(logits, args.budget, args.topk_cap), 2))
        print(f"  reference (full sort + Python heap):   {ref * 1e3:8.1f} ms  -> {ref / med['kernel']:.1f}x")
    mask = timed(lambda: du.visibility_mask(tree), args.repeats)
    print(f"  visibility_mask [{args.batch}, {args.budget + 1}, {args.budget + 1}]: {statistics.median(mask) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

"""DDTree tree building on this CPU: the shipped build_ddtree against a straightforward Python heap.

Shape: batch 8, budget 64, block 16 (15 drafted positions after the bonus token), vocab 151,936
(Qwen's). The reference is the same best-first algorithm written the obvious way: a full
log-softmax and a full sort of the vocabulary at every position, then heapq reading scores from
tensors one element at a time. Both must produce the same trees; the script checks that first.

    python bench/tree_build.py [--repeats 5] [--topk-cap N]
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

PAYLOAD = Path(__file__).resolve().parents[1] / "playbooks/ddtree/payload/ddtree_utils.py"


def load_payload():
    spec = importlib.util.spec_from_file_location("ddtree_utils_bench", PAYLOAD)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--topk-cap", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    du = load_payload()
    depth = args.block - 1
    logits = torch.randn(args.batch, depth, args.vocab, generator=torch.Generator().manual_seed(0)) * 3

    tree = du.build_ddtree(logits, args.budget, args.topk_cap)
    for b, (parents, tokens) in enumerate(reference_build(logits, args.budget, args.topk_cap)):
        assert tree.parents[b, : len(parents)].tolist() == parents, f"row {b}: parents differ"
        assert tree.tokens[b, 1: len(tokens)].tolist() == tokens[1:], f"row {b}: tokens differ"

    fast = timed(lambda: du.build_ddtree(logits, args.budget, args.topk_cap), args.repeats)
    ref = timed(lambda: reference_build(logits, args.budget, args.topk_cap), max(1, args.repeats // 2))
    k = min(args.budget, args.vocab, args.topk_cap or args.vocab)
    prune = timed(lambda: du._candidates(logits, k), args.repeats)
    mask = timed(lambda: du.visibility_mask(tree), args.repeats)
    med = statistics.median
    print(f"tree build: batch {args.batch}, budget {args.budget}, block {args.block} ({depth} drafted positions), "
          f"vocab {args.vocab:,}, topk_cap {args.topk_cap}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"  build_ddtree (top-k prune + heap): {med(fast) * 1e3:8.1f} ms  (of which top-k + logsumexp {med(prune) * 1e3:.1f} ms)")
    print(f"  reference (full sort + heap):      {med(ref) * 1e3:8.1f} ms")
    print(f"  speed-up: {med(ref) / med(fast):.1f}x   (same trees: checked)")
    print(f"  visibility_mask [{args.batch}, {args.budget + 1}, {args.budget + 1}]: {med(mask) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

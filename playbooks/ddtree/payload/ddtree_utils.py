"""DDTree: a draft tree grown best-first from a block drafter's per-position distributions.

Shipped inside SGLang as ``sglang.srt.speculative.ddtree_utils``; pure torch, no sglang import, so
the same file runs in the GPU worker, in the offline smoke test and in CPU unit tests.

A tree has ``budget + 1`` node slots per request. Slot 0 is the root (the last committed token);
every other node is one drafted token at depth >= 1, and a node's score is the joint draft
log-probability of the path from the root to it. Nodes are numbered in the order the heap pops
them, so a parent always has a lower index than its children and siblings are in rank order.
Unused slots (a vocabulary or a top-k cap too small to fill the budget) have ``valid == False``.

The per-depth candidates (top-k log-probabilities) come from the compiled kernel
``fleetspec_ddtree::topk_logprobs`` when the release's library is loaded (one pass over the
logits), otherwise from torch (topk, then logsumexp). Both order ties by the lower token id and
give the same trees; ``kernel_status()`` and ``DDTree.candidates`` say which one ran.
"""

from __future__ import annotations

import heapq
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "DDTree",
    "WalkResult",
    "build_ddtree",
    "visibility_mask",
    "position_ids",
    "verify_greedy",
    "verify_sampling",
    "to_sglang_layout",
    "tree_summary",
    "load_kernel",
    "kernel_status",
    "kernel_line",
]

KERNEL_OP = "fleetspec_ddtree::topk_logprobs"
KERNEL_LIBRARY = "tree_mask.so"
_KERNEL = {"loaded": False, "library": None, "error": None, "devices": []}


def _registered_devices() -> list[str]:
    """The dispatch keys (cpu, cuda) the topk_logprobs op has a kernel for, [] if not registered."""
    found = []
    for key in ("CPU", "CUDA"):
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(KERNEL_OP, key):
                found.append(key.lower())
        except RuntimeError:
            return []
    return found


def _op_devices() -> list[str]:
    """The devices whose kernel this engine uses. The CUDA one only with FLEETSPEC_DDTREE_KERNEL=cuda:
    on an H200 it was no faster than torch's logsumexp + topk (0.97x bf16, 0.75x fp32) and its
    equality check failed on signed zeros (fixed since, not yet re-run on a GPU), so torch serves
    CUDA rows by default."""
    found = _registered_devices()
    if os.environ.get("FLEETSPEC_DDTREE_KERNEL", "auto") != "cuda":
        found = [d for d in found if d != "cuda"]
    return found


def _default_library() -> Path | None:
    """$FLEETSPEC_KERNELS (the release's kernels folder, set by fleetspec's drop-in), else the
    kernels folder of the release this file's overlay belongs to (release/overlay/sglang/srt/
    speculative/ddtree_utils.py -> release/kernels)."""
    folder = os.environ.get("FLEETSPEC_KERNELS")
    if folder:
        return Path(folder) / KERNEL_LIBRARY
    here = Path(__file__).resolve()
    if len(here.parents) > 4 and here.parents[3].name == "overlay":
        return here.parents[4] / "kernels" / KERNEL_LIBRARY
    return None


def load_kernel(library: str | os.PathLike | None = None) -> dict:
    """Load the compiled library (default: the release's) once; never raises. A library whose ops
    are already registered (loaded by someone else in this process) is not loaded a second time:
    two copies of one TORCH_LIBRARY abort the process."""
    if _registered_devices():
        _KERNEL.update(loaded=True, error=None, devices=_op_devices())
        _KERNEL["library"] = _KERNEL["library"] or (str(library) if library else "already loaded")
        return kernel_status()
    path = Path(library) if library else _default_library()
    if path is None:
        _KERNEL.update(loaded=False, library=None, error="no kernel library (FLEETSPEC_KERNELS unset)")
        return kernel_status()
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as err:
        _KERNEL.update(loaded=False, library=str(path), error=f"{type(err).__name__}: {err}")
        return kernel_status()
    devices = _op_devices()
    _KERNEL.update(loaded=bool(devices), library=str(path), devices=devices,
                   error=None if devices else f"{path} does not register {KERNEL_OP}")
    return kernel_status()


def kernel_status() -> dict:
    """JSON-able: whether the compiled candidates kernel is loaded, from where, for which devices."""
    return {"op": KERNEL_OP, **{k: (list(v) if isinstance(v, list) else v) for k, v in _KERNEL.items()}}


def kernel_line() -> str:
    """The path the candidates take in this process, in one line for the engine log: the kernel
    and its library, or the torch fallback and why."""
    if _KERNEL["loaded"]:
        return f"fleetspec_ddtree: kernel:{','.join(_KERNEL['devices'])} from {_KERNEL['library']}"
    return f"fleetspec_ddtree: torch fallback ({_KERNEL['error'] or 'kernel not loaded'})"


@dataclass
class DDTree:
    tokens: torch.Tensor  # long[B, N]; root holds root_tokens (or -1), padding -1
    parents: torch.Tensor  # long[B, N]; -1 for the root and for padding
    depth: torch.Tensor  # long[B, N]; 0 for the root and for padding
    scores: torch.Tensor  # float[B, N]; joint draft log-prob, 0 at the root, -inf for padding
    valid: torch.Tensor  # bool[B, N]
    budget: int
    candidates: str = "none"  # which path chose the candidates: kernel:<device> or torch:<device>

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def sizes(self) -> torch.Tensor:
        return self.valid.sum(dim=1)

    @property
    def max_depth(self) -> int:
        return int(self.depth.max().item()) if self.depth.numel() else 0


@dataclass
class WalkResult:
    accepted_tokens: torch.Tensor  # long[B, max_depth]; accepted draft tokens, -1 after the end
    bonus: torch.Tensor  # long[B]; the target's token after the last accepted node
    accepted_nodes: torch.Tensor  # long[B, max_depth + 1]; root first, -1 after the end
    accept_length: torch.Tensor  # long[B]; number of accepted draft tokens


def _candidates_torch(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probs and token ids per row with torch, ties ordered by the lower token id.

    torch.topk leaves the order of equal values open, so the k values are re-sorted stably by id;
    a row where more values equal the k-th than fit takes the lowest ids among them.
    """
    logits = draft_logits.float()
    vocab = logits.shape[-1]
    values, ids = torch.topk(logits, min(k + 1, vocab), dim=-1, largest=True, sorted=True)
    # the (k+1)-th equal to the k-th: ties at the boundary, so which ids are in is picked by id
    crowded = values[..., k] == values[..., k - 1] if k < vocab else torch.zeros(values.shape[:-1], dtype=torch.bool,
                                                                                  device=values.device)
    values, ids = values[..., :k], ids[..., :k]
    kth = values[..., -1:]
    if bool(crowded.any()):
        rows = crowded.nonzero(as_tuple=True)
        sub, sub_kth = logits[rows], kth[rows]
        above = sub > sub_kth
        equal = sub == sub_kth
        need = k - above.sum(dim=-1, keepdim=True)
        take = above | (equal & (equal.cumsum(dim=-1) <= need))
        picked = take.nonzero()[:, 1].view(-1, k)      # ids ascending, k per row
        ids = ids.clone()
        values = values.clone()
        ids[rows] = picked
        values[rows] = sub.gather(-1, picked)
    by_id, order = ids.sort(dim=-1)
    values = values.gather(-1, order)
    values, order = values.sort(dim=-1, descending=True, stable=True)
    ids = by_id.gather(-1, order)
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    return values - log_z, ids


def _candidates(draft_logits: torch.Tensor, k: int, use_kernel: bool | None = None):
    """(logp, ids, path): top-k log-probs and ids per depth (a tree of `budget` nodes never uses
    more), from the compiled kernel when it is loaded for this device, else from torch.
    use_kernel: None = when available, True = required (raises if not), False = torch only."""
    device = draft_logits.device.type
    if use_kernel is not False and device in _KERNEL["devices"]:
        fn = torch.ops.fleetspec_ddtree.topk_logprobs
        logp, ids = fn(draft_logits, k)
        return logp, ids, f"kernel:{device}"
    if use_kernel:
        raise RuntimeError(f"{KERNEL_OP} is not loaded for {device}: {_KERNEL['error'] or 'no kernel for this device'}")
    logp, ids = _candidates_torch(draft_logits, k)
    return logp, ids, f"torch:{device}"


def _grow(logp: list[list[float]], ids: list[list[int]], budget: int):
    """Best-first growth of one tree: pop the likeliest prefix, push its next sibling and first child.

    Ranks within a depth are sorted by log-prob and log-probs are <= 0, so every pushed prefix scores
    no higher than the one that pushed it: pops come out in descending joint log-prob, and the
    popped set is the `budget` likeliest prefixes, closed under taking parents.
    """
    depth_count, k = len(logp), len(logp[0])
    parents, tokens, depths, scores = [-1], [-1], [0], [0.0]
    # (-score, tie-break, depth index, rank, parent node); FIFO among equal scores.
    heap = [(-logp[0][0], 0, 0, 0, 0)] if logp[0][0] > -math.inf else []
    order = 1
    while heap and len(parents) <= budget:
        neg, _, d, r, p = heapq.heappop(heap)
        node = len(parents)
        parents.append(p)
        tokens.append(ids[d][r])
        depths.append(d + 1)
        scores.append(-neg)
        if r + 1 < k and logp[d][r + 1] > -math.inf:
            heapq.heappush(heap, (-(scores[p] + logp[d][r + 1]), order, d, r + 1, p))
            order += 1
        if d + 1 < depth_count and logp[d + 1][0] > -math.inf:
            heapq.heappush(heap, (neg - logp[d + 1][0], order, d + 1, 0, node))
            order += 1
    return parents, tokens, depths, scores


def build_ddtree(draft_logits: torch.Tensor, budget: int, topk_cap: int | None = None,
                 *, root_tokens: torch.Tensor | None = None, use_kernel: bool | None = None) -> DDTree:
    """Grow one tree per request from draft_logits[B, D, V] (row d: the token at depth d + 1)."""
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be [batch, depth, vocab], got {tuple(draft_logits.shape)}")
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if topk_cap is not None and topk_cap < 1:
        raise ValueError(f"topk_cap must be >= 1 or None, got {topk_cap}")
    batch, depth_count, vocab = draft_logits.shape
    n = budget + 1
    device = draft_logits.device
    tokens = torch.full((batch, n), -1, dtype=torch.long)
    parents = torch.full((batch, n), -1, dtype=torch.long)
    depth = torch.zeros((batch, n), dtype=torch.long)
    scores = torch.full((batch, n), -math.inf, dtype=torch.float32)
    valid = torch.zeros((batch, n), dtype=torch.bool)
    path = "none"
    if depth_count > 0 and vocab > 0:
        k = min(budget, vocab, topk_cap or vocab)
        logp, ids, path = _candidates(draft_logits, k, use_kernel)
        logp_rows, id_rows = logp.cpu().tolist(), ids.cpu().tolist()
        for b in range(batch):
            p, t, d, s = _grow(logp_rows[b], id_rows[b], budget)
            size = len(p)
            parents[b, :size] = torch.tensor(p)
            tokens[b, :size] = torch.tensor(t)
            depth[b, :size] = torch.tensor(d)
            scores[b, :size] = torch.tensor(s)
            valid[b, :size] = True
    scores[:, 0] = 0.0
    valid[:, 0] = True
    if root_tokens is not None:
        tokens[:, 0] = root_tokens.to("cpu", torch.long)
    return DDTree(tokens.to(device), parents.to(device), depth.to(device), scores.to(device),
                  valid.to(device), budget, path)


def visibility_mask(tree: DDTree) -> torch.Tensor:
    """bool[B, N, N]: row i may attend to column j iff j is i or one of i's ancestors."""
    batch, n = tree.parents.shape
    mask = torch.zeros((batch, n, n), dtype=torch.bool, device=tree.parents.device)
    own = torch.arange(n, device=tree.parents.device).expand(batch, n)
    cur = own.clone()
    for _ in range(tree.max_depth + 1):
        at = torch.where(cur >= 0, cur, own)
        mask.scatter_(2, at.unsqueeze(-1), True)
        cur = torch.where(cur >= 0, tree.parents.gather(1, at), cur)
    return mask


def position_ids(tree: DDTree, start: torch.Tensor) -> torch.Tensor:
    """long[B, N]: start + depth, so siblings share a position as they share a context length."""
    return start.to(tree.depth.device, torch.long).view(-1, 1) + tree.depth


def _walk(tree: DDTree, chosen: torch.Tensor) -> WalkResult:
    """Follow, from the root, the child whose token is the target's choice at its parent.

    Sibling tokens are distinct, so at most one child matches and the matched nodes form one chain.
    """
    batch, n = tree.tokens.shape
    safe_parent = tree.parents.clamp(min=0)
    match = tree.valid & (tree.parents >= 0) & (tree.tokens == chosen.gather(1, safe_parent))
    is_root = torch.zeros_like(match)
    is_root[:, 0] = True
    on_path = is_root.clone()
    max_depth = tree.max_depth
    for _ in range(max_depth):
        on_path = is_root | (match & on_path.gather(1, safe_parent))
    last = torch.where(on_path, tree.depth, torch.full_like(tree.depth, -1)).argmax(dim=1)
    accept_length = tree.depth.gather(1, last.unsqueeze(1)).squeeze(1)
    bonus = chosen.gather(1, last.unsqueeze(1)).squeeze(1)

    nodes = torch.full((batch, max_depth + 1), -1, dtype=torch.long, device=tree.tokens.device)
    rows = torch.arange(batch, device=tree.tokens.device)
    cur = last.clone()
    for _ in range(max_depth + 1):
        alive = cur >= 0
        safe = cur.clamp(min=0)
        slot = torch.where(alive, tree.depth[rows, safe], torch.full_like(cur, max_depth))
        nodes[rows[alive], slot[alive]] = cur[alive]
        cur = torch.where(alive, tree.parents[rows, safe], cur)
    path = nodes[:, 1:]
    accepted_tokens = torch.where(path >= 0, tree.tokens.gather(1, path.clamp(min=0)),
                                  torch.full_like(path, -1))
    return WalkResult(accepted_tokens, bonus, nodes, accept_length)


def verify_greedy(tree: DDTree, target_logits: torch.Tensor) -> WalkResult:
    """Greedy verification: target_logits[B, N, V] holds the target's next-token logits at each node."""
    return _walk(tree, target_logits.argmax(dim=-1))


def verify_sampling(tree: DDTree, target_logits: torch.Tensor, draft_logits: torch.Tensor | None = None,
                    generator: torch.Generator | None = None, *, temperature: float = 1.0) -> WalkResult:
    """Lossless sampling: draw the target's token at every node, then walk while a child matches.

    The tree's tokens are chosen deterministically (top ranks), not sampled from the drafter, so
    matching a target sample accepts each child with exactly its target probability and the output
    is distributed as the target's. draft_logits is accepted for API symmetry and not needed.
    """
    del draft_logits
    batch, n, vocab = target_logits.shape
    probs = torch.softmax(target_logits.float() / temperature, dim=-1).view(-1, vocab)
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)
    draws = torch.multinomial(probs, 1, generator=generator).view(batch, n).to(tree.tokens.device)
    return _walk(tree, draws)


def to_sglang_layout(tree: DDTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's tree-verify layout: retrive_index (flat row-major slot), first child, next sibling.

    Same meaning as in eagle_utils' build_tree_kernel_efficient: local node indices, -1 for none.
    """
    batch, n = tree.parents.shape
    device = tree.parents.device
    index = torch.arange(batch * n, device=device, dtype=torch.long).view(batch, n)
    idx = torch.arange(n, device=device)
    is_child = tree.valid & (tree.parents >= 0)
    # j is i's next sibling when they share a parent and j is the first such index after i.
    same_parent = (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)) & is_child.unsqueeze(1)
    later = idx.view(1, 1, n) > idx.view(1, n, 1)
    big = torch.full((), n, device=device, dtype=torch.long)
    sibling = torch.where(same_parent & later, idx.view(1, 1, n), big).amin(dim=2)
    sibling = torch.where(is_child & (sibling < n), sibling, torch.full_like(sibling, -1))
    # The first child of p is the lowest index whose parent is p.
    child_of = (tree.parents.unsqueeze(1) == idx.view(1, n, 1)) & is_child.unsqueeze(1)
    first = torch.where(child_of, idx.view(1, 1, n), big).amin(dim=2)
    first = torch.where(first < n, first, torch.full_like(first, -1))
    return index, first, sibling


def tree_summary(tree: DDTree) -> dict:
    """JSON-able: tree sizes, depth histogram and expected acceptance length under the drafter."""
    sizes = tree.sizes.tolist()
    drafted = tree.valid & (tree.depth > 0)
    hist = torch.bincount(tree.depth[drafted].flatten().cpu(), minlength=tree.max_depth + 1)
    expected = torch.where(drafted, tree.scores.exp(), torch.zeros_like(tree.scores)).sum(dim=1)
    return {
        "batch": tree.batch_size,
        "budget": tree.budget,
        "sizes": [int(s) for s in sizes],
        "max_depth": tree.max_depth,
        "depth_histogram": [int(c) for c in hist.tolist()],
        "expected_acceptance": [round(float(e), 6) for e in expected.tolist()],
        "mean_expected_acceptance": round(float(expected.mean()), 6) if tree.batch_size else 0.0,
        "candidates": tree.candidates,
    }


if os.environ.get("FLEETSPEC_DDTREE_KERNEL", "auto") != "off":
    load_kernel()
else:
    _KERNEL["error"] = "FLEETSPEC_DDTREE_KERNEL=off"
if os.environ.get("FLEETSPEC_KERNELS"):     # a deployed engine: its log (the journal) says which path runs
    print(kernel_line(), file=sys.stderr, flush=True)

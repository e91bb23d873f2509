"""The stand-in's "models": a deterministic target and drafters whose acceptance is honest.

The target is greedy over a 64-word vocabulary: the next token is a hash of everything so far, so
the output of a prompt is the same for every algorithm (speculation must never change greedy
output). The drafters see the true continuation through noise: at each depth the true token is the
drafter's top-1 with a probability that decays with depth, else ranked 2nd–4th, else absent. A
chain drafter (NEXTN, DFlash) accepts only leading top-1 hits; DDTree builds a real tree from the
same DFlash logits with the deployed `ddtree_utils` and walks it with `verify_greedy`, so its extra
acceptance is whatever the deployed tree code really finds.
"""

from __future__ import annotations

import hashlib
import random
import struct

WORDS = (
    "the a of to and in is it that for on with as was at by be this from or an are not have has "
    "had one all were we when there can more if out so what up about into than them time only "
    "new some could these two may first then do any like my now over such our man me even most "
    "made after also did many"
).split()


def vocab(size: int = 64) -> list[str]:
    return WORDS[:size]


def _h(*parts) -> int:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return struct.unpack("<Q", digest[:8])[0]


def tokenize(text: str, size: int = 64) -> list[int]:
    return [_h("tok", w) % size for w in text.split()] or [0]


def detokenize(ids: list[int], size: int = 64) -> str:
    words = vocab(size)
    return " ".join(words[i % len(words)] for i in ids)


class Target:
    """next(state) is the target's greedy token; the state is a running hash of the context."""

    def __init__(self, prompt_ids: list[int], size: int = 64):
        self.size = size
        self.state = _h("ctx", *prompt_ids)

    def continuation(self, state: int, n: int) -> list[int]:
        out = []
        for _ in range(n):
            tok = _h("next", state) % self.size
            out.append(tok)
            state = _h("step", state, tok)
        return out

    def advance(self, tokens: list[int]) -> None:
        for tok in tokens:
            self.state = _h("step", self.state, tok)


# Per algorithm: probability that the drafter's top-1 at depth 0 is right, and its decay by depth.
DRAFTERS = {"EAGLE": (0.72, 0.80), "EAGLE3": (0.75, 0.82), "STANDALONE": (0.6, 0.8),
            "NGRAM": (0.5, 0.7), "DFLASH": (0.86, 0.88), "DDTREE": (0.86, 0.88)}


def draft_ranks(state: int, depth: int, algorithm: str, step: int) -> list[int]:
    """Rank of the true token in the drafter's distribution at each depth (0 = top-1, -1 = absent)."""
    p0, decay = DRAFTERS.get("DFLASH" if algorithm == "DDTREE" else algorithm, (0.0, 0.0))
    rng = random.Random(_h("draft", state, step))
    ranks = []
    for d in range(depth):
        r = rng.random()
        p1 = p0 * decay ** d
        if r < p1:
            ranks.append(0)
        elif r < p1 + (1 - p1) * 0.7:
            ranks.append(rng.randint(1, 3))
        else:
            ranks.append(-1)
    return ranks


def chain_accept(ranks: list[int]) -> int:
    """Draft tokens a chain drafter gets accepted: the leading top-1 hits."""
    n = 0
    for r in ranks:
        if r != 0:
            break
        n += 1
    return n


def draft_logits(truth: list[int], ranks: list[int], size: int, seed: int):
    """[1, D, V] logits with the true token at the given rank per depth (torch, built lazily)."""
    import torch

    rng = random.Random(seed)
    logits = torch.full((1, len(truth), size), -8.0)
    for d, (tok, rank) in enumerate(zip(truth, ranks)):
        others = [t for t in range(size) if t != tok]
        rng.shuffle(others)
        order = others[:rank] + [tok] + others[rank:] if rank >= 0 else others[:8]
        for i, t in enumerate(order[:8]):
            logits[0, d, t] = 4.0 - 1.2 * i
    return logits


class TreeVerifier:
    """Acceptance for DDTREE from the host's deployed `sglang.srt.speculative.ddtree_utils`."""

    def __init__(self, budget: int, topk_cap: int | None, depth: int):
        from sglang.srt.speculative.ddtree_utils import build_ddtree, position_ids, verify_greedy

        self.build, self.positions, self.verify = build_ddtree, position_ids, verify_greedy
        self.budget, self.topk_cap, self.depth = budget, topk_cap, depth

    def accept(self, truth: list[int], ranks: list[int], size: int, seed: int) -> int:
        """Draft tokens accepted (excluding the bonus token)."""
        import torch

        tree = self.build(draft_logits(truth, ranks, size, seed), self.budget, self.topk_cap)
        depth = self.positions(tree, torch.zeros(1, dtype=torch.long))[0]
        depth = depth - depth.min()
        # The target at a node of depth d predicts the true token d+1 along the path. Only nodes on
        # the true path are ever reached by the walk, so this is the target's real answer there.
        n_nodes = depth.shape[0]
        target = torch.full((1, n_nodes, size), -8.0)
        for n in range(n_nodes):
            d = int(depth[n])
            if d < len(truth):
                target[0, n, truth[d]] = 8.0
        walk = self.verify(tree, target)
        length = walk.accept_length
        length = int(length[0] if hasattr(length, "__getitem__") else length)
        return min(length, len(truth))

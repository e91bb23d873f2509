"""The stand-in's models: a deterministic target language model and noisy drafters of it.

Target. A language model over a small vocabulary whose next-token logits are a pure function of
the context it sees, given as (position, token) pairs: the pairs are folded into a 64-bit digest
in (position, token) order and the digest seeds the logits. A plain sequence t_0..t_{L-1} is the
pairs (i, t_i), so a tree node whose attention mask shows it exactly its ancestors at positions
start + depth sees the same context as the sequence "prompt + path to the node" and predicts the
same token; a node that also sees a sibling, misses an ancestor or gets a wrong position id sees a
different context and predicts something else, as a real transformer would.

Drafters. A drafter is the target seen through noise: at depth d of a block it takes the target's
logits along the target's own greedy continuation and moves the target's top token to rank r
(r = 0 with probability p0 * decay**d, else 1..3, else out of the top 8). The noise is seeded by
the context and the drafter family only, so the same context always gets the same draft, whatever
the step number or the algorithm that asked (DFLASH and DDTREE share the DFlash drafter).
"""

from __future__ import annotations

import hashlib
import struct

WORDS = (
    "the a of to and in is it that for on with as was at by be this from or an are not have has "
    "had one all were we when there can more if out so what up about into than them time only "
    "new some could these two may first then do any like my now over such our man me even most "
    "made after also did many"
).split()

MASK = (1 << 64) - 1
START = 0x5EED_F1EE_75BE_C000
LOGIT_SCALE = 6.0          # logits = 6 * U[0, 1): a peaked but not one-hot distribution

# Per drafter family: probability that the drafter's top-1 at depth 0 is the target's token, and
# its decay by depth (figures chosen so DFlash's 15-deep block accepts ~3 and NEXTN's 3 ~2).
DRAFTERS = {"EAGLE": (0.72, 0.80), "EAGLE3": (0.75, 0.82), "STANDALONE": (0.6, 0.8),
            "NGRAM": (0.5, 0.7), "DFLASH": (0.86, 0.88)}


def family(algorithm: str) -> str:
    """DDTREE drafts with DFlash's block drafter (it is DFlash underneath)."""
    return "DFLASH" if algorithm == "DDTREE" else algorithm


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


def mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash."""
    x &= MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def fold(digest: int, position: int, token: int) -> int:
    """The digest of a context extended by one (position, token) pair."""
    return mix(digest ^ mix((position + 1) * 0x9E3779B97F4A7C15 + (token + 2) * 0xD6E8FEB86659FD93))


def fold_pairs(digest: int, pairs) -> int:
    """Fold (position, token) pairs in (position, token) order: what attention sees is a set."""
    for pos, tok in sorted(pairs):
        digest = fold(digest, int(pos), int(tok))
    return digest


class Sequence:
    """Committed tokens and the digest of every prefix (digests[i] = context of the first i)."""

    def __init__(self, tokens: list[int]):
        self.tokens: list[int] = []
        self.digests = [START]
        self.extend(tokens)

    def extend(self, tokens) -> None:
        for tok in tokens:
            self.digests.append(fold(self.digests[-1], len(self.tokens), int(tok)))
            self.tokens.append(int(tok))

    def __len__(self) -> int:
        return len(self.tokens)


class TargetLM:
    """logits(digests) -> float[N, V]: the next-token logits for N contexts."""

    def __init__(self, size: int = 64):
        import torch

        self.size = size
        self._torch = torch
        self._gen = torch.Generator()

    def logits(self, digests: list[int]):
        torch = self._torch
        rows = []
        for d in digests:
            self._gen.manual_seed(int(d) & 0x7FFF_FFFF_FFFF_FFFF)
            rows.append(torch.rand(self.size, generator=self._gen))
        if not rows:
            return torch.empty(0, self.size)
        return torch.stack(rows) * LOGIT_SCALE

    def greedy(self, digest: int) -> int:
        return int(self.logits([digest])[0].argmax())

    def greedy_chain(self, seq: Sequence, n: int) -> tuple[list[int], list[int]]:
        """The target's own next n tokens after seq, and the digest before each of them."""
        digest, pos, tokens, digests = seq.digests[-1], len(seq), [], []
        for _ in range(n):
            digests.append(digest)
            tok = self.greedy(digest)
            tokens.append(tok)
            digest = fold(digest, pos, tok)
            pos += 1
        return tokens, digests


class Drafter:
    """draft_logits(seq, depth) -> float[depth, V]: row d drafts the token at depth d + 1."""

    def __init__(self, algorithm: str, target: TargetLM):
        self.family = family(algorithm)
        self.p0, self.decay = DRAFTERS.get(self.family, (0.5, 0.7))
        self.target = target

    def rank(self, digest: int, depth: int) -> int:
        """Where this drafter puts the target's token at this context: 0 top-1, -1 outside top 8."""
        u = mix(digest ^ _h("drafter", self.family)) / float(MASK + 1)
        v = mix(digest ^ _h("drafter-rank", self.family)) / float(MASK + 1)
        p1 = self.p0 * self.decay ** depth
        if u < p1:
            return 0
        if u < p1 + (1 - p1) * 0.7:
            return 1 + int(v * 3)
        return -1

    def draft_logits(self, seq: Sequence, depth: int):
        """Calibrated: the top-1 gets log p(depth), ranks 1-3 share 70% of the rest, the others 30%;
        the ranking is the target's own at that context with its top token moved to rank r."""
        import math

        torch = self.target._torch
        size = self.target.size
        if depth <= 0:
            return torch.empty(0, size)
        _, digests = self.target.greedy_chain(seq, depth)
        target_rows = self.target.logits(digests)
        rows = torch.empty(depth, size)
        for d in range(depth):
            order = torch.argsort(target_rows[d], descending=True).tolist()
            top = order.pop(0)
            r = self.rank(digests[d], d)
            order.insert(r if r >= 0 else len(order), top)
            p1 = self.p0 * self.decay ** d
            by_rank = [math.log(p1)] + [math.log(0.7 * (1 - p1) / 3)] * 3
            by_rank += [math.log(0.3 * (1 - p1) / max(1, size - 4))] * (size - 4)
            for i in range(1, len(by_rank)):                   # deep rows: keep rank order
                by_rank[i] = min(by_rank[i], by_rank[i - 1])
            for rank, tok in enumerate(order):
                rows[d, tok] = by_rank[rank] - 1e-4 * rank      # strictly decreasing by rank
        return rows

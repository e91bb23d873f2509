"""DDTree's losslessness through real attention: a tiny randomly initialised Qwen3 target (the
transformers model class, seeded, nothing downloaded) verifies the payload's trees in one forward
over all tree nodes, with the payload's visibility_mask as the 4-D attention mask and its
position_ids as positions, and verify_greedy picks the accepted path. The emitted tokens must
equal plain greedy decoding token for token, and a tree must accept more per step than the
drafter's chain of the same depth.

The drafter is the target with noise on its weights, run greedily for `depth` steps; its
per-step distributions are the draft logits (what a block drafter such as DFlash provides).
Float64 keeps the tree forward and the plain forward from disagreeing on near-ties through
summation order alone.

Also a script: `python tests/unit/test_ddtree_attention.py --device cuda --size large` (what
scripts/gpu-check.sh runs) prints one verdict line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import pytest

from fleetspec.model import payload

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


SIZES = {   # hidden, layers, heads, kv heads, vocab, prompts, new tokens
    "small": dict(hidden=64, layers=2, heads=4, kv_heads=2, vocab=256, prompts=16, new_tokens=24),
    "large": dict(hidden=512, layers=6, heads=8, kv_heads=4, vocab=8192, prompts=32, new_tokens=48),
}


def _payload():
    return payload.load("ddtree_utils", "ddtree_utils_attention")


def tiny_qwen3(size: dict, seed: int, device: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=2 * size["hidden"],
                         num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                         num_key_value_heads=size["kv_heads"], head_dim=size["hidden"] // size["heads"],
                         max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
                         attn_implementation="eager")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(device=device, dtype=torch.float64).eval()
    return model


def noisy_copy(model, scale: float, seed: int):
    """The drafter: the target's weights plus Gaussian noise (correlated, imperfect)."""
    import copy

    drafter = copy.deepcopy(model)
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device) * scale * p.std())
    return drafter


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, n: int) -> list[int]:
    seq = prompt.clone()
    for _ in range(n):
        nxt = model(input_ids=seq.unsqueeze(0)).logits[0, -1].argmax()
        seq = torch.cat([seq, nxt.view(1)])
    return seq[len(prompt):].tolist()


@torch.no_grad()
def draft_logits(drafter, seq: torch.Tensor, depth: int) -> torch.Tensor:
    """[1, depth, V]: the drafter's distribution at each of the next `depth` positions along its
    own greedy continuation (row d: the token at depth d + 1)."""
    rows, cur = [], seq
    for _ in range(depth):
        logits = drafter(input_ids=cur.unsqueeze(0)).logits[0, -1]
        rows.append(logits)
        cur = torch.cat([cur, logits.argmax().view(1)])
    return torch.stack(rows).unsqueeze(0)


@torch.no_grad()
def tree_step(du, target, drafter, seq: torch.Tensor, depth: int, budget: int, topk_cap: int | None):
    """One DDTree step: draft, build the tree rooted at the last committed token, verify it in one
    target forward over prefix + tree nodes, walk greedily. Returns (new tokens, accepted)."""
    dl = draft_logits(drafter, seq, depth)
    tree = du.build_ddtree(dl, budget, topk_cap, root_tokens=seq[-1:])
    valid = tree.valid[0]
    nodes = valid.nonzero().squeeze(1)                      # the valid node slots (0 = root)
    n, prefix = int(nodes.numel()), seq.numel() - 1
    vis = du.visibility_mask(tree)[0][nodes][:, nodes]      # [n, n] ancestors and self
    allowed = torch.zeros(prefix + n, prefix + n, dtype=torch.bool, device=seq.device)
    allowed[:prefix, :prefix] = torch.ones(prefix, prefix, dtype=torch.bool, device=seq.device).tril()
    allowed[prefix:, :prefix] = True                        # every tree node sees the whole prefix
    allowed[prefix:, prefix:] = vis
    mask = torch.zeros(allowed.shape, dtype=torch.float64, device=seq.device)
    mask.masked_fill_(~allowed, torch.finfo(torch.float64).min)
    pos_tree = du.position_ids(tree, torch.tensor([prefix], device=seq.device))[0][nodes]
    input_ids = torch.cat([seq[:-1], tree.tokens[0][nodes]]).unsqueeze(0)
    positions = torch.cat([torch.arange(prefix, device=seq.device), pos_tree]).unsqueeze(0)
    out = target(input_ids=input_ids, attention_mask=mask.view(1, 1, *mask.shape), position_ids=positions).logits
    target_logits = torch.zeros(1, tree.num_nodes, out.shape[-1], dtype=out.dtype, device=out.device)
    target_logits[0, nodes] = out[0, prefix:]
    walk = du.verify_greedy(tree, target_logits)
    k = int(walk.accept_length[0])
    return walk.accepted_tokens[0, :k].tolist() + [int(walk.bonus[0])], k


def decode(du, target, drafter, prompt, n, depth, budget, topk_cap):
    seq, accepted, steps = prompt.clone(), 0, 0
    while seq.numel() - prompt.numel() < n:
        new, k = tree_step(du, target, drafter, seq, depth, budget, topk_cap)
        seq = torch.cat([seq, torch.tensor(new, device=seq.device)])
        accepted, steps = accepted + k, steps + 1
    return seq[prompt.numel():prompt.numel() + n].tolist(), accepted / steps


@dataclass
class Verdict:
    prompts: int
    tokens: int
    mismatches: int
    tree_accept: float
    chain_accept: float
    seconds: float

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.tree_accept > self.chain_accept

    def line(self, label: str) -> str:
        return (f"{'PASS' if self.ok else 'FAIL'} {label}: {self.prompts} prompts, {self.tokens} tokens, "
                f"{self.mismatches} differing from plain greedy; accepted per step: tree "
                f"{self.tree_accept:.2f} vs chain {self.chain_accept:.2f} ({self.seconds:.1f} s)")


def run(size_name: str = "small", device: str = "cpu", depth: int = 6, budget: int = 24, seed: int = 0,
        prompts: int | None = None) -> Verdict:
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)    # tiny matrices: one thread is faster, and fair to a shared machine
    try:
        return _run(SIZES[size_name], device, depth, budget, seed, prompts)
    finally:
        torch.set_num_threads(threads)


def _run(size: dict, device: str, depth: int, budget: int, seed: int, prompts: int | None) -> Verdict:
    du = _payload()
    began = time.monotonic()
    target = tiny_qwen3(size, seed, device)
    drafter = noisy_copy(target, 0.1, seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    mismatches = tokens = 0
    tree_acc, chain_acc = [], []
    count = prompts or size["prompts"]
    for _ in range(count):
        prompt = torch.randint(0, size["vocab"], (8,), generator=g).to(device)
        want = greedy(target, prompt, size["new_tokens"])
        got, acc = decode(du, target, drafter, prompt, size["new_tokens"], depth, budget, None)
        chain, chain_a = decode(du, target, drafter, prompt, size["new_tokens"], depth, depth, 1)
        mismatches += sum(a != b for a, b in zip(got, want, strict=True)) + sum(a != b for a, b in zip(chain, want, strict=True))
        tokens += len(want)
        tree_acc.append(acc)
        chain_acc.append(chain_a)
    return Verdict(count, tokens, mismatches, sum(tree_acc) / len(tree_acc),
                   sum(chain_acc) / len(chain_acc), time.monotonic() - began)


def test_tree_decoding_through_real_attention_equals_greedy_and_beats_the_chain():
    verdict = run(os.environ.get("FLEETSPEC_ATTN_SIZE", "small"), os.environ.get("FLEETSPEC_ATTN_DEVICE", "cpu"))
    assert verdict.mismatches == 0, verdict.line("tree attention")
    assert verdict.tree_accept > verdict.chain_accept, verdict.line("tree attention")
    assert 0 < verdict.chain_accept < 6, verdict.line("tree attention")   # a drafter that is neither perfect nor useless


def test_the_visibility_mask_matters():
    """A target that sees every tree node (a plain causal mask over the flattened tree) would read
    sibling branches: its logits at some node must differ, or this test proves nothing."""
    du = _payload()
    size = SIZES["small"]
    target = tiny_qwen3(size, 3, "cpu")
    drafter = noisy_copy(target, 0.1, 4)
    seq = torch.randint(0, size["vocab"], (8,), generator=torch.Generator().manual_seed(5))
    tree = du.build_ddtree(draft_logits(drafter, seq, 4), 16, None, root_tokens=seq[-1:])
    ids = torch.cat([seq[:-1], tree.tokens[0]]).unsqueeze(0)
    pos = torch.cat([torch.arange(7), du.position_ids(tree, torch.tensor([7]))[0]]).unsqueeze(0)
    with torch.no_grad():
        causal = target(input_ids=ids, position_ids=pos).logits[0, 7:]
        allowed = torch.ones(7 + 17, 7 + 17, dtype=torch.bool).tril()
        allowed[7:, 7:] = du.visibility_mask(tree)[0]
        mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
        tree_out = target(input_ids=ids, attention_mask=mask.view(1, 1, *mask.shape), position_ids=pos).logits[0, 7:]
    assert torch.allclose(causal[:2], tree_out[:2])          # root and its first child see the same
    assert not torch.allclose(causal, tree_out)                # later nodes would have read other branches


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="DDTree verification through a tiny Qwen3's real attention")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--prompts", type=int, default=None)
    args = ap.parse_args()
    v = run(args.size, args.device, prompts=args.prompts)
    print(v.line(f"tree attention ({args.size} model on {args.device})"))
    sys.exit(0 if v.ok else 1)

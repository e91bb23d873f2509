"""The DDTree payload against brute force, plain greedy decoding and the target distribution."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetspec.model import payload


def _load():
    return payload.load("ddtree_utils", "ddtree_utils_under_test")


du = _load()


def _logits(seed: int, shape, quantize: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 2
    return x.round() if quantize else x


def _brute_force_scores(logp_row: torch.Tensor, budget: int, cap: int | None) -> list[float]:
    """Every prefix over each depth's top-`cap` tokens, scored by joint log-prob; the best `budget`."""
    depth_count, vocab = logp_row.shape
    allowed = [torch.argsort(logp_row[d], descending=True)[: cap or vocab].tolist()
               for d in range(depth_count)]
    scores = []
    for length in range(1, depth_count + 1):
        for seq in itertools.product(*allowed[:length]):
            scores.append(sum(float(logp_row[d, t]) for d, t in enumerate(seq)))
    return sorted(scores, reverse=True)[:budget]


def _prefix(tree, b: int, i: int) -> tuple[int, ...]:
    out = []
    while i > 0:
        out.append(int(tree.tokens[b, i]))
        i = int(tree.parents[b, i])
    return tuple(reversed(out))


@settings(max_examples=150, deadline=None)
@given(batch=st.integers(1, 3), depth=st.integers(1, 4), vocab=st.integers(1, 5),
       budget=st.integers(1, 14), cap=st.one_of(st.none(), st.integers(1, 4)),
       seed=st.integers(0, 2**31 - 1), quantize=st.booleans())
def test_heap_tree_is_the_brute_force_best_tree(batch, depth, vocab, budget, cap, seed, quantize):
    logits = _logits(seed, (batch, depth, vocab), quantize)
    tree = du.build_ddtree(logits, budget, cap)
    logp = torch.log_softmax(logits.float(), dim=-1)
    assert tree.tokens.shape == (batch, budget + 1)
    for b in range(batch):
        want = _brute_force_scores(logp[b], budget, cap)
        size = int(tree.sizes[b])
        assert size == len(want) + 1
        got = sorted(tree.scores[b, 1:size].tolist(), reverse=True)
        assert got == pytest.approx(want, abs=1e-4)
        assert not tree.valid[b, size:].any()
        seen = set()
        for i in range(1, size):
            p = int(tree.parents[b, i])
            assert 0 <= p < i and bool(tree.valid[b, p])
            assert int(tree.depth[b, i]) == int(tree.depth[b, p]) + 1
            d, t = int(tree.depth[b, i]), int(tree.tokens[b, i])
            assert float(tree.scores[b, i]) == pytest.approx(float(tree.scores[b, p] + logp[b, d - 1, t]), abs=1e-4)
            key = _prefix(tree, b, i)
            assert key not in seen  # siblings carry distinct tokens
            seen.add(key)


def test_budget_and_cap_are_validated():
    with pytest.raises(ValueError, match="budget"):
        du.build_ddtree(torch.zeros(1, 2, 3), 0)
    with pytest.raises(ValueError, match="topk_cap"):
        du.build_ddtree(torch.zeros(1, 2, 3), 4, 0)


def test_topk_cap_one_is_a_chain_of_the_argmax():
    logits = _logits(3, (2, 5, 11), False)
    tree = du.build_ddtree(logits, 16, 1)
    assert tree.sizes.tolist() == [6, 6]
    assert torch.equal(tree.tokens[:, 1:6], logits.argmax(-1))
    assert torch.equal(tree.parents[:, 1:6], torch.arange(5).expand(2, 5))


def test_root_tokens_fill_slot_zero():
    tree = du.build_ddtree(torch.zeros(2, 2, 4), 3, root_tokens=torch.tensor([7, 9]))
    assert tree.tokens[:, 0].tolist() == [7, 9]


def _random_trees(seed: int, batch: int, depth: int, vocab: int, budget: int):
    logits = _logits(seed, (batch, depth, vocab), False)
    return logits, du.build_ddtree(logits, budget, None)


def test_visibility_mask_is_ancestors_and_self():
    _, tree = _random_trees(5, 4, 4, 6, 12)
    mask = du.visibility_mask(tree)
    for b in range(4):
        for i in range(tree.num_nodes):
            want = {i}
            j = int(tree.parents[b, i])
            while j >= 0:
                want.add(j)
                j = int(tree.parents[b, j])
            assert set(torch.nonzero(mask[b, i]).flatten().tolist()) == want


def test_position_ids_are_start_plus_depth():
    _, tree = _random_trees(6, 3, 3, 5, 7)
    pos = du.position_ids(tree, torch.tensor([10, 0, 5]))
    assert torch.equal(pos, torch.tensor([10, 0, 5]).view(3, 1) + tree.depth)


def _target_logits(tree, draft_logits, noise: torch.Tensor, vocab: int) -> torch.Tensor:
    """A target model as a function of the prefix: the drafter's guess plus prefix-keyed noise."""
    batch, n = tree.tokens.shape
    out = torch.empty(batch, n, vocab)
    for b in range(batch):
        for i in range(n):
            out[b, i] = _target_at(b, _prefix(tree, b, i), draft_logits, noise)
    return out


def _target_at(b: int, prefix: tuple[int, ...], draft_logits, noise) -> torch.Tensor:
    depth = len(prefix)
    base = draft_logits[b, depth] if depth < draft_logits.shape[1] else torch.zeros(draft_logits.shape[2])
    key = hash((b, prefix)) % noise.shape[0]
    return base + 1.5 * noise[key]


def test_greedy_walk_equals_plain_greedy_decoding_on_thousands_of_cases():
    batch, depth, vocab, budget = 2000, 4, 5, 10
    draft_logits, tree = _random_trees(11, batch, depth, vocab, budget)
    noise = torch.randn(4099, vocab, generator=torch.Generator().manual_seed(12))
    target = _target_logits(tree, draft_logits, noise, vocab)
    result = du.verify_greedy(tree, target)
    lengths = []
    for b in range(batch):
        nodes = {_prefix(tree, b, i) for i in range(int(tree.sizes[b]))}
        prefix, emitted = (), []
        while True:
            token = int(_target_at(b, prefix, draft_logits, noise).argmax())
            emitted.append(token)
            if prefix + (token,) not in nodes:
                break
            prefix += (token,)
        length = len(emitted) - 1
        lengths.append(length)
        assert int(result.accept_length[b]) == length
        assert result.accepted_tokens[b, :length].tolist() == emitted[:-1]
        assert int(result.bonus[b]) == emitted[-1]
        path = result.accepted_nodes[b, : length + 1].tolist()
        assert path[0] == 0 and [_prefix(tree, b, i) for i in path][-1] == tuple(emitted[:-1])
        assert (result.accepted_nodes[b, length + 1:] == -1).all()
    assert 0 < sum(lengths) / batch < depth  # the cases exercise both acceptance and rejection


def _sglang_walk(candidates, target_predict, index, next_token, next_sibling):
    """What sgl_kernel's verify_tree_greedy does with SGLang's layout, written as a plain loop."""
    accepted, cur = [], 0
    while True:
        child, found = int(next_token[cur]), False
        while child != -1:
            if int(candidates[child]) == int(target_predict[cur]):
                accepted.append(child)
                cur, found = child, True
                break
            child = int(next_sibling[child])
        if not found:
            return accepted, int(target_predict[cur])


def test_sglang_layout_walks_to_the_same_result():
    batch, vocab = 300, 4
    draft_logits, tree = _random_trees(21, batch, 4, vocab, 9)
    target = draft_logits.new_zeros(batch, tree.num_nodes, vocab)
    target += torch.randn(target.shape, generator=torch.Generator().manual_seed(22))
    index, next_token, next_sibling = du.to_sglang_layout(tree)
    assert torch.equal(index.flatten(), torch.arange(batch * tree.num_nodes))
    result = du.verify_greedy(tree, target)
    predict = target.argmax(-1)
    for b in range(batch):
        nodes, bonus = _sglang_walk(tree.tokens[b], predict[b], index[b], next_token[b], next_sibling[b])
        length = int(result.accept_length[b])
        assert nodes == result.accepted_nodes[b, 1: length + 1].tolist()
        assert bonus == int(result.bonus[b])


def _chi_square_p(observed: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * observed.sum()
    keep = expected > 0
    stat = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         stat.double() / 2.0))


def test_sampling_matches_the_target_distribution():
    vocab, trials = 6, 60000
    draft = _logits(31, (1, 3, vocab), False)
    one = du.build_ddtree(draft, 8, None)
    target_one = torch.randn(1, one.num_nodes, vocab, generator=torch.Generator().manual_seed(32))
    tree = du.DDTree(*(t.expand(trials, -1).contiguous() for t in
                       (one.tokens, one.parents, one.depth, one.scores, one.valid)), one.budget)
    target = target_one.expand(trials, -1, -1).contiguous()
    result = du.verify_sampling(tree, target, draft, torch.Generator().manual_seed(33))
    first = torch.where(result.accept_length > 0, result.accepted_tokens[:, 0], result.bonus)
    p_first = torch.softmax(target_one[0, 0], -1)
    assert _chi_square_p(torch.bincount(first, minlength=vocab).double(), p_first.double()) > 1e-3
    # Given an accepted first token c, the next emitted token follows the target at node c.
    child = int(one.tokens[0, 1])
    taken = result.accept_length > 0
    took_child = taken & (result.accepted_nodes[:, 1] == 1)
    second = torch.where(result.accept_length > 1, result.accepted_tokens[:, 1], result.bonus)[took_child]
    p_second = torch.softmax(target_one[0, 1], -1)
    assert second.numel() > 1000 and int(first[took_child][0]) == child
    assert _chi_square_p(torch.bincount(second, minlength=vocab).double(), p_second.double()) > 1e-3


def test_sampling_is_deterministic_for_a_seed():
    draft, tree = _random_trees(41, 16, 3, 7, 6)
    target = torch.randn(16, tree.num_nodes, 7, generator=torch.Generator().manual_seed(42))
    a = du.verify_sampling(tree, target, draft, torch.Generator().manual_seed(1))
    b = du.verify_sampling(tree, target, draft, torch.Generator().manual_seed(1))
    assert torch.equal(a.accepted_nodes, b.accepted_nodes) and torch.equal(a.bonus, b.bonus)


def test_summary_is_json_and_consistent():
    _, tree = _random_trees(51, 3, 4, 9, 10)
    summary = du.tree_summary(tree)
    json.dumps(summary)
    assert summary["sizes"] == tree.sizes.tolist()
    assert sum(summary["depth_histogram"]) == sum(s - 1 for s in summary["sizes"])
    assert summary["depth_histogram"][0] == 0
    for b, expected in enumerate(summary["expected_acceptance"]):
        want = sum(math.exp(float(s)) for s in tree.scores[b, 1: int(tree.sizes[b])])
        assert expected == pytest.approx(want, rel=1e-4)


def test_small_vocab_pads_unused_slots():
    tree = du.build_ddtree(torch.zeros(1, 2, 2), 10)
    assert int(tree.sizes[0]) == 1 + 2 + 4
    assert (tree.parents[0, 7:] == -1).all() and not tree.valid[0, 7:].any()
    mask = du.visibility_mask(tree)
    assert torch.equal(mask[0, 7:, 7:], torch.eye(4, dtype=torch.bool))


def test_minus_infinity_logits_never_enter_the_tree():
    logits = torch.tensor([[[0.0, -math.inf, -math.inf]]])
    tree = du.build_ddtree(logits, 5)
    assert int(tree.sizes[0]) == 2 and int(tree.tokens[0, 1]) == 0
    random.seed(0)

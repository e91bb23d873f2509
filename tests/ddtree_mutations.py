"""Broken DDTree payloads: each a source edit of `ddtree_utils.py` that a real bug could make.

Shared by the stand-in's unit tests (tests/unit/test_lab_engine_decode.py: the decode loop sees
each one) and the lab's mutation tests (tests/lab/test_mutations.py: the gates revert each one).
`mutate(source, name)` raises when its anchor is gone, so a rewrite of the payload that moves the
code fails loudly here instead of silently testing the unmutated file.
"""

from __future__ import annotations

MUTATIONS = {
    # verify_greedy accepts one token too many: at the last accepted node the target is made to
    # "choose" that node's first child, so the walk takes it whatever the target predicted.
    "greedy_one_too_many": (
        "    return _walk(tree, target_logits.argmax(dim=-1))\n",
        """    chosen = target_logits.argmax(dim=-1)
    walk = _walk(tree, chosen)
    last = walk.accepted_nodes.gather(1, walk.accept_length.view(-1, 1)).squeeze(1)
    n = tree.tokens.shape[1]
    idx = torch.arange(n, device=tree.tokens.device).view(1, -1)
    kid = torch.where(tree.valid & (tree.parents == last.view(-1, 1)), idx, torch.full_like(idx, n)).amin(dim=1)
    rows = torch.arange(chosen.shape[0], device=chosen.device)
    has = kid < n
    chosen = chosen.clone()
    chosen[rows[has], last[has]] = tree.tokens[rows[has], kid[has]]
    return _walk(tree, chosen)
""",
    ),
    # The tree mask lets a node see its previous sibling (same parent, index one lower).
    "mask_sees_sibling": (
        "        cur = torch.where(cur >= 0, tree.parents.gather(1, at), cur)\n    return mask\n",
        """        cur = torch.where(cur >= 0, tree.parents.gather(1, at), cur)
    same = (tree.parents[:, 1:] == tree.parents[:, :-1]) & (tree.parents[:, 1:] >= 0)
    mask[:, 1:, :-1] |= torch.diag_embed(same)
    return mask
""",
    ),
    # build_ddtree drops every node's highest-scoring child (the drafter's top-1 at each depth):
    # the heap starts each node's children at rank 1. Edited in _grow, which every candidate path
    # (torch or a compiled top-k kernel) feeds.
    "drops_best_child": [
        ("    heap = [(-logp[0][0], 0, 0, 0, 0)] if logp[0][0] > -math.inf else []\n",
         "    heap = [(-logp[0][1], 0, 0, 1, 0)] if logp[0][1] > -math.inf else []\n"),
        ("            heapq.heappush(heap, (neg - logp[d + 1][0], order, d + 1, 0, node))\n",
         "            heapq.heappush(heap, (neg - logp[d + 1][1], order, d + 1, 1, node))\n"),
    ],
    # The sampling walk draws from a sharpened target (temperature halved): biased output.
    "sampling_biased": (
        "    probs = torch.softmax(target_logits.float() / temperature, dim=-1).view(-1, vocab)\n",
        "    probs = torch.softmax(target_logits.float() / (temperature * 0.5), dim=-1).view(-1, vocab)\n",
    ),
}


def mutate(source: str, name: str) -> str:
    edits = MUTATIONS[name]
    for old, new in edits if isinstance(edits, list) else [edits]:
        if source.count(old) != 1:
            raise AssertionError(f"mutation {name}: its anchor is not in ddtree_utils.py exactly once; update "
                                 "tests/ddtree_mutations.py to the payload's new code")
        source = source.replace(old, new)
    return source

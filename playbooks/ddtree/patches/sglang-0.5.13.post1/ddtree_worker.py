"""DDTREE's worker for sglang 0.5.13.post1: DFlash's block drafter, a DDTree over its block.

GPU-only code, UNPROVEN: no GPU was available where it was written; it imports on CPU and the tree
logic it calls (ddtree_utils) is tested on CPU, but the forward passes here have never run.

- shadow-linear (required on hybrid targets): build the tree from the draft block's logits, log
  its summary (SGLANG_DDTREE_LOG=<path>), verify DFlash's linear block as before.
- tree: verify every tree node in one target pass with an ancestor-only mask, walk the tree
  greedily, then reorder the verified rows so the accepted path comes first and DFlash's own
  linear commit (KV slots, hidden states, draft KV append) applies to it unchanged. Falls back to
  the linear block, with a warning, where that reordering is not valid: non-greedy sampling,
  page_size > 1, tp > 1, or an attention backend that ignores custom masks.
"""

from __future__ import annotations

import json
import logging
import os
import time

import torch

from sglang.srt.speculative.ddtree_config import DEFAULT_BUDGET
from sglang.srt.speculative.ddtree_utils import (
    build_ddtree,
    position_ids,
    tree_summary,
    verify_greedy,
    visibility_mask,
)
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_worker import DFlashWorker

logger = logging.getLogger(__name__)


class TreeLog:
    """One JSON line per drafted batch: the tree's size, depth histogram, expected acceptance."""

    def __init__(self, path: str | None):
        self.path = path

    @classmethod
    def from_env(cls, rank: int) -> "TreeLog":
        value = os.environ.get("SGLANG_DDTREE_LOG", "0")
        return cls(None if value in ("", "0") or rank != 0 else value)

    def write(self, tree, mode: str) -> None:
        if self.path is None:
            return
        record = {"ts": time.time(), "mode": mode, **tree_summary(tree)}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")


class DDTreeVerifyInput(DFlashVerifyInput):
    """A tree of `draft_token_num` nodes per request, verified then reordered into a linear chain."""

    tree = None

    def verify(self, *, batch, logits_output, page_size):
        bs, n = self.tree.tokens.shape
        logits = logits_output.next_token_logits.view(bs, n, -1)
        walk = verify_greedy(self.tree, logits)
        order = _path_first(walk.accepted_nodes, walk.accept_length, n)
        rows = (order + torch.arange(bs, device=order.device).view(-1, 1) * n).flatten()
        logits_output.next_token_logits = logits_output.next_token_logits[rows]
        if logits_output.hidden_states is not None:
            logits_output.hidden_states = logits_output.hidden_states[rows]
        batch.out_cache_loc = batch.out_cache_loc[rows]
        chain = self.tree.tokens.gather(1, order)
        beyond = torch.arange(n, device=chain.device).view(1, -1) > walk.accept_length.view(-1, 1)
        self.draft_token = torch.where(beyond, torch.full_like(chain, -1), chain).flatten()
        return super().verify(batch=batch, logits_output=logits_output, page_size=page_size)


def _path_first(nodes: torch.Tensor, length: torch.Tensor, n: int) -> torch.Tensor:
    """long[B, N]: the accepted path's node indices first, then every other node in index order."""
    bs = nodes.shape[0]
    on_path = torch.zeros((bs, n), dtype=torch.bool, device=nodes.device)
    keep = nodes >= 0
    on_path[torch.arange(bs, device=nodes.device).view(-1, 1).expand_as(nodes)[keep], nodes[keep]] = True
    rest = torch.argsort(on_path.to(torch.int8), dim=1, stable=True)  # off-path nodes first, in order
    out = torch.empty_like(rest)
    for b in range(bs):
        path = nodes[b, : int(length[b]) + 1]
        others = rest[b, : n - path.numel()]
        out[b] = torch.cat([path, others])
    return out


class DDTreeWorker(DFlashWorker):
    def __init__(self, server_args, *args, **kwargs):
        super().__init__(server_args, *args, **kwargs)
        self.ddtree_budget = int(server_args.speculative_ddtree_budget or DEFAULT_BUDGET)
        self.ddtree_topk_cap = server_args.speculative_ddtree_topk_cap
        self.ddtree_shadow_linear = bool(server_args.speculative_ddtree_shadow_linear)
        self.ddtree_log = TreeLog.from_env(self.tp_rank)
        self._ddtree_warned: set[str] = set()

    def _warn_once(self, reason: str) -> None:
        if reason not in self._ddtree_warned and self.tp_rank == 0:
            logger.warning("DDTREE: verifying the linear DFlash block: %s", reason)
            self._ddtree_warned.add(reason)

    def _draft_logits(self, draft_hidden, lm_head):
        if int(self.server_args.tp_size) != 1:
            self._warn_once("tp > 1 (the draft head is sharded; trees are built with tp == 1 only)")
            return None
        vocab = int(self.model_runner.model_config.vocab_size)
        hidden = draft_hidden[:, 1:, :]
        return torch.matmul(hidden.to(lm_head.weight.dtype), lm_head.weight[:vocab].t()).float()

    def _build_verify_input(self, batch, draft_hidden, lm_head, block_ids, positions_2d):
        linear, build_custom_mask = super()._build_verify_input(
            batch, draft_hidden, lm_head, block_ids, positions_2d
        )
        logits = self._draft_logits(draft_hidden, lm_head)
        if logits is None:
            return linear, build_custom_mask
        tree = build_ddtree(logits, self.ddtree_budget, self.ddtree_topk_cap,
                            root_tokens=block_ids[:, 0])
        reason = self._linear_reason(batch, build_custom_mask)
        self.ddtree_log.write(tree, "shadow-linear" if reason else "tree")
        if reason:
            if not self.ddtree_shadow_linear:
                self._warn_once(reason)
            return linear, build_custom_mask
        tokens = torch.where(tree.valid, tree.tokens, tree.tokens[:, :1].expand_as(tree.tokens))
        verify = DDTreeVerifyInput(
            draft_token=tokens.flatten(),
            positions=position_ids(tree, batch.seq_lens).flatten(),
            draft_token_num=tree.num_nodes,
            tree_visibility=visibility_mask(tree),
        )
        verify.tree = tree
        return verify, True

    def _linear_reason(self, batch, build_custom_mask):
        if self.ddtree_shadow_linear:
            return "shadow-linear"
        if batch.sampling_info is not None and not batch.sampling_info.is_all_greedy:
            return "non-greedy sampling"
        if self.page_size != 1:
            return "page_size > 1"
        if not build_custom_mask:
            return "the attention backend ignores custom masks"
        return None

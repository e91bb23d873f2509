"""DDTREE's worker for sglang 0.5.23: DFlashWorkerV2 with DDTree's settings attached.

GPU-only, UNPROVEN (no GPU where it was written); it imports on CPU. On 0.5.23 the draft head runs
inside DFlash's captured CUDA graph, so trees are not built here yet: both modes verify DFlash's
linear block, which is what shadow-linear promises for verification, and a warning says that tree
verification and tree logging are not available on this version.
"""

from __future__ import annotations

import logging

from sglang.srt.speculative.ddtree_config import DEFAULT_BUDGET
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

logger = logging.getLogger(__name__)


class DDTreeWorkerV2(DFlashWorkerV2):
    def __init__(self, server_args, *args, **kwargs):
        super().__init__(server_args, *args, **kwargs)
        self.ddtree_budget = int(getattr(server_args, "speculative_ddtree_budget", None) or DEFAULT_BUDGET)
        self.ddtree_topk_cap = getattr(server_args, "speculative_ddtree_topk_cap", None)
        self.ddtree_shadow_linear = bool(getattr(server_args, "speculative_ddtree_shadow_linear", False))
        logger.warning(
            "DDTREE on sglang 0.5.23 verifies DFlash's linear block (budget=%s, topk_cap=%s, "
            "shadow_linear=%s): tree verification and tree logging are implemented for 0.5.13.post1 only.",
            self.ddtree_budget, self.ddtree_topk_cap, self.ddtree_shadow_linear,
        )

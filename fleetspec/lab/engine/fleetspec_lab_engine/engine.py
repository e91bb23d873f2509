"""Generation: verify steps paced by engine.json, acceptance per algorithm, faults per request."""

from __future__ import annotations

import os
import random
import threading
import time

from fleetspec_lab_engine import model, settings

CHAIN_DEPTH = {"EAGLE": 3, "EAGLE3": 3, "STANDALONE": 3, "NGRAM": 3, "DFLASH": 15, "DDTREE": 15}


class Engine:
    def __init__(self, parsed, config: dict):
        self.parsed, self.config = parsed, config
        self.algorithm = parsed.algorithm
        self.size = int(config.get("vocab", 64))
        self.depth = self._depth()
        self.tree = None
        if self.algorithm == "DDTREE":
            budget = int(parsed.get("speculative_ddtree_budget", 64))
            cap = parsed.get("speculative_ddtree_topk_cap", 8)
            self.tree = model.TreeVerifier(budget, int(cap) if cap else None, self.depth)
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0,
                      "verify_ct": 0, "running": 0, "last_throughput": 0.0}

    def _depth(self) -> int:
        if self.algorithm == "NONE":
            return 0
        steps = self.parsed.get("speculative_num_steps")
        drafts = self.parsed.get("speculative_num_draft_tokens")
        if self.algorithm in ("EAGLE", "EAGLE3", "STANDALONE") and steps:
            return int(steps)
        if drafts:
            return max(1, int(drafts) - 1)
        return CHAIN_DEPTH.get(self.algorithm, 3)

    def step_seconds(self, faults: dict) -> float:
        factor = self.config.get("step_factor", {}).get(self.algorithm, 1.0)
        slow = float(faults.get("slow_tokens", 1) or 1)
        return float(self.config["step_seconds"]) * factor * slow

    def accept_length(self) -> float | None:
        with self.lock:
            ct = self.stats["verify_ct"]
            return self.stats["generation_tokens"] / ct if ct and self.algorithm != "NONE" else None

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 on_step=None, seed=None) -> dict:
        """Run to completion; on_step(ids_so_far, verify_ct) is called after every verify step."""
        faults = settings.faults()
        start = time.monotonic()
        target = model.Target(prompt_ids, self.size)
        sampler = random.Random(seed if seed is not None else os.urandom(8)) if temperature > 0 else None
        out: list[int] = []
        verify_ct = 0
        with self.lock:
            self.stats["running"] += 1
        try:
            while len(out) < max_new_tokens:
                step_start = time.monotonic()
                accepted = self._draft_accepted(target, verify_ct)
                n = min(accepted + 1, max_new_tokens - len(out))
                tokens = target.continuation(target.state, n)
                if sampler is not None:
                    tokens = [t if sampler.random() < 0.7 else sampler.randrange(self.size) for t in tokens]
                target.advance(tokens)
                out.extend(tokens)
                verify_ct += 1
                time.sleep(max(0.0, self.step_seconds(faults) - (time.monotonic() - step_start)))
                if on_step:
                    on_step(out, verify_ct)
        finally:
            with self.lock:
                self.stats["running"] -= 1
        if faults.get("garbage_output"):
            out = [random.randrange(self.size) for _ in out]
        elapsed = time.monotonic() - start
        with self.lock:
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += len(prompt_ids)
            self.stats["generation_tokens"] += len(out)
            self.stats["verify_ct"] += verify_ct
            self.stats["last_throughput"] = len(out) / elapsed if elapsed else 0.0
        return {"ids": out, "verify_ct": verify_ct, "elapsed": elapsed}

    def _draft_accepted(self, target: model.Target, step: int) -> int:
        if self.algorithm == "NONE" or self.depth == 0:
            return 0
        ranks = model.draft_ranks(target.state, self.depth, self.algorithm, step)
        if self.tree is not None:
            truth = target.continuation(target.state, self.depth)
            return self.tree.accept(truth, ranks, self.size, seed=target.state ^ step)
        return model.chain_accept(ranks)

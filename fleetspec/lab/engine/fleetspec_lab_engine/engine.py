"""Generation: the decode loop of `decode.py`, paced by its cost model, with faults per request."""

from __future__ import annotations

import os
import random
import threading
import time

from . import decode, settings


class Engine:
    def __init__(self, parsed, config: dict, worker_cls=None, ddtree=None):
        self.parsed, self.config = parsed, config
        self.algorithm = parsed.algorithm
        self.size = int(config.get("vocab", 64))
        import torch

        torch.set_num_threads(1)   # [65, 64] tensors: threads only add latency on shared cores
        self.plan = decode.make_plan(self.algorithm, parsed.values, worker_cls)
        if self.plan.build_tree and ddtree is None:
            import importlib

            ddtree = importlib.import_module("sglang.srt.speculative.ddtree_utils")
        self.decoder = decode.Decoder(self.plan, self.size, ddtree, decode.tree_log_path())
        self.depth = self.plan.depth
        self.graph_size = decode.graph_size(parsed.values, getattr(parsed, "version", None), decode.gpu_memory_mib(),
                                            decode.explicit_graph(list(getattr(parsed, "argv", None) or [])))
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "accepted_tokens": 0,
                      "verify_ct": 0, "running": 0, "last_throughput": 0.0, "trees_built": 0,
                      "steps_by_mode": {}, "steps_without_graph": 0}

    def step_seconds(self, step: decode.Step, faults: dict) -> float:
        slow = float(faults.get("slow_tokens", 1) or 1)
        with self.lock:
            running = self.stats["running"]
        graph = decode.graph_factor(running, self.graph_size, self.config.get("graph_miss_factor", 1.0))
        if graph != 1.0:
            with self.lock:
                self.stats["steps_without_graph"] += 1
        return float(self.config["step_seconds"]) * decode.step_cost(step, self.config) * slow * graph

    def accept_length(self) -> float | None:
        """Tokens per verify step, as sglang's avg_spec_accept_length (accepted + bonus)."""
        with self.lock:
            ct = self.stats["verify_ct"]
            return self.stats["generation_tokens"] / ct if ct and self.algorithm != "NONE" else None

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 on_step=None, seed=None) -> dict:
        """Run to completion; on_step(ids_so_far, verify_ct) is called after every verify step."""
        faults = settings.faults()
        start = time.monotonic()
        generator = None
        if temperature > 0:
            import torch

            generator = torch.Generator()
            generator.manual_seed(int(seed) if seed is not None else int.from_bytes(os.urandom(7), "little"))
        with self.lock:
            self.stats["running"] += 1
        state = {"last": time.monotonic()}

        def paced(out, steps):
            # Sleep what is left of the step's modelled time after the work it really took.
            step = steps[-1]
            left = self.step_seconds(step, faults) - (time.monotonic() - state["last"])
            if left > 0:
                time.sleep(left)
            state["last"] = time.monotonic()
            if on_step:
                on_step(list(out), len(steps))

        try:
            out, steps = decode.decode(self.decoder, prompt_ids, max_new_tokens, temperature, generator, paced)
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
            self.stats["accepted_tokens"] += sum(s.accepted for s in steps)
            self.stats["verify_ct"] += len(steps)
            self.stats["trees_built"] += sum(1 for s in steps if s.tree is not None)
            for s in steps:
                self.stats["steps_by_mode"][s.mode] = self.stats["steps_by_mode"].get(s.mode, 0) + 1
            self.stats["last_throughput"] = len(out) / elapsed if elapsed else 0.0
        return {"ids": out, "verify_ct": len(steps), "elapsed": elapsed,
                "accepted": sum(s.accepted for s in steps), "proposed": sum(s.drafted for s in steps)}

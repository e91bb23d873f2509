"""The stand-in's decode loop: speculative decoding done the way the engine does it, minus the GPU.

One step, for every algorithm:
1. draft: the algorithm's drafter proposes `depth` positions (model.Drafter);
2. build what is verified: nothing (NONE), the drafter's top-1 chain (NEXTN/EAGLE/DFLASH, and
   DDTREE wherever the real worker verifies linearly), or a DDTree grown by the DEPLOYED
   `build_ddtree` from the drafter's logits;
3. the target's logits at every verified node, each from that node's own context: for a tree the
   context is read off the DEPLOYED `visibility_mask` and `position_ids` (model's docstring says
   why a wrong mask or position then predicts a different token);
4. walk: the DEPLOYED `verify_greedy` for a tree, a linear walk for a chain;
5. emit the accepted tokens and the bonus token.

So a broken tree, mask, position or walk changes what is emitted (greedy output then differs from
plain greedy decoding, which the parity gate compares) or how much is accepted (the acceptance
gate), as it would on a GPU.

Which verification DDTREE gets is what the real worker would do with this configuration
(`ddtree_plan`): sglang 0.5.23's DDTreeWorkerV2 builds no trees; 0.5.13.post1's DDTreeWorker
builds none with tp > 1, and otherwise asks its own `_linear_reason` (shadow-linear, non-greedy
sampling, page_size > 1), which the stand-in calls on the deployed worker class.

Cost model (one rule for every algorithm, `step_cost`): a step costs
`step_seconds * (1 + verify_node_cost * (verified - 1) + draft_token_cost * drafted)`, where
`step_seconds` is one target forward over one token, `verified` the nodes in the target's verify
pass (1 for plain decoding, depth + 1 for a chain, budget + 1 for a tree) and `drafted` the
positions the drafter proposed. A GPU verify pass is memory-bound, so extra nodes cost a fraction
of a step (default 0.01 each: 64 extra nodes add ~64%).

CUDA graphs (`graph_size`, `graph_factor`): the real engine replays a captured graph for a batch of
at most its graph size (--cuda-graph-max-bs, --cuda-graph-max-bs-decode on 0.5.23; when unset,
sglang's own choice from the memory and count the lab's nvidia-smi stand-in reports, or its
fallback of 160 without one) and runs a larger batch eagerly, which is slower. The stand-in runs each request
on its own thread, so a step taken while more requests are running than the graph holds costs
`graph_miss_factor` times as much (none with --disable-cuda-graph counts as size 0).
"""

from __future__ import annotations

import json
import os
import types
from dataclasses import dataclass, field

from . import model

CHAIN_DEPTH = {"EAGLE": 3, "EAGLE3": 3, "STANDALONE": 3, "NGRAM": 3, "DFLASH": 15, "DDTREE": 15}
COSTS = {"verify_node_cost": 0.01, "draft_token_cost": 0.01}
SGLANG_FALLBACK_GRAPH_BS = 160     # sglang's max bs without GPU memory facts (as fleetspec.model.graphsize)


@dataclass
class Plan:
    """How this engine decodes, settled at start and reported by /server_info."""

    algorithm: str
    depth: int = 0                     # draft positions per step
    greedy_mode: str = "none"          # none | chain | tree | shadow-linear | linear
    sampling_mode: str = "none"        # what a non-greedy request gets
    reason: str = ""                   # why DDTREE verifies linearly, when it does
    build_tree: bool = False           # DDTREE builds (and logs) a tree even when verifying linearly
    budget: int = 64
    topk_cap: int | None = None
    worker: str | None = None          # the worker class the real dispatch picked

    def mode(self, greedy: bool) -> str:
        return self.greedy_mode if greedy else self.sampling_mode

    def as_dict(self) -> dict:
        return {"algorithm": self.algorithm, "depth": self.depth, "verify_mode": self.greedy_mode,
                "sampling_verify_mode": self.sampling_mode, "linear_reason": self.reason or None,
                "builds_trees": self.build_tree, "budget": self.budget, "topk_cap": self.topk_cap,
                "worker": self.worker}


@dataclass
class Step:
    emitted: list[int]
    accepted: int                      # draft tokens accepted (emitted = accepted + bonus)
    verified: int                      # nodes in the target's verify pass
    drafted: int                       # positions the drafter proposed
    mode: str
    tree: dict | None = field(default=None)


def _older_than_0_5_14(version: str | None) -> bool:
    import re

    nums = [int(n) for n in re.findall(r"\d+", version or "")[:3]]
    return bool(nums) and tuple(nums) < (0, 5, 14)


# sglang's own max bs by the smallest GPU's memory (MiB, upper bound exclusive): (bound, TP < 4, TP >= 4),
# as fleetspec.model.graphsize has it from 0.5.13.post1 server_args.py:1468-1525 and 0.5.23
# arg_groups/memory_hook.py:89-176 (which differ only in the 20-35 GiB row).
_BS_ROWS = ((20 * 1024, 8, 8), (35 * 1024, 24, 80), (60 * 1024, 32, 160), (90 * 1024, 256, 512),
            (160 * 1024, 256, 512), (float("inf"), 512, 512))
_BS_ROWS_0_5_23 = (_BS_ROWS[0], (35 * 1024, 48, 160), *_BS_ROWS[2:])
GRAPH_FLAGS = ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--cuda-graph-bs", "--cuda-graph-bs-decode")


def gpu_memory_mib(folder: str | None = None) -> float | None:
    """The smallest GPU's memory.total (MiB) from the lab's nvidia-smi stand-in tables (lab/gpu.py),
    which is what sglang reads from nvidia-smi on a GPU host; None on a host without them."""
    import csv

    path = os.path.join(folder or os.environ.get("FLEETSPEC_LAB_GPU", "/etc/fleetspec-lab/gpu"), "query-gpu.csv")
    try:
        with open(path, newline="") as fh:
            rows = [[c.strip() for c in r] for r in csv.reader(fh, skipinitialspace=True) if r]
        col = [h.partition(" [")[0] for h in rows[0]].index("memory.total")
        return min(float(r[col].split()[0]) for r in rows[1:])
    except (OSError, ValueError, IndexError):
        return None


def explicit_graph(argv: list[str]) -> bool:
    """Whether the launch sets the graph's size itself (else sglang chooses it)."""
    return any(a.split("=", 1)[0] in GRAPH_FLAGS for a in argv)


def graph_size(values: dict, version: str | None = None, gpu_mem: float | None = None,
               explicit: bool = True) -> int:
    """The largest batch the engine's decode/verify CUDA graph holds: the flag (0.5.23's
    cuda_graph_max_bs_decode before cuda_graph_max_bs), else sglang's own choice, from the GPU's
    memory and TP when the stand-in nvidia-smi gives one (`gpu_mem`), else its fallback of 160;
    0.5.23 caps its own choice at --max-running-requests; 0 with --disable-cuda-graph. `explicit`
    False: the values' graph size is one sglang resolved without a GPU (0.5.23 resolves on the
    CPU), so the GPU's own choice replaces it."""
    if values.get("disable_cuda_graph"):
        return 0
    for dest in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
        value = values.get(dest)
        if (explicit or gpu_mem is None) and (
                isinstance(value, int) and not isinstance(value, bool) or isinstance(value, str) and value.isdigit()):
            return int(value)
    bs = SGLANG_FALLBACK_GRAPH_BS
    if gpu_mem is not None:
        rows = _BS_ROWS if _older_than_0_5_14(version) else _BS_ROWS_0_5_23
        _bound, small, large = next(r for r in rows if gpu_mem < r[0])
        tp = values.get("tp_size") or values.get("tensor_parallel_size") or 1
        bs = small if int(tp) < 4 else large
    running = values.get("max_running_requests")
    if not _older_than_0_5_14(version) and isinstance(running, int) and 0 < running < bs:
        return running
    return bs


def graph_factor(running: int, size: int, factor: float) -> float:
    """What a step costs, in units of its graph-replayed cost, with `running` requests in the batch."""
    return float(factor) if running > size else 1.0


def depth_for(algorithm: str, values: dict) -> int:
    if algorithm == "NONE":
        return 0
    steps = values.get("speculative_num_steps")
    drafts = values.get("speculative_num_draft_tokens")
    if algorithm in ("EAGLE", "EAGLE3", "STANDALONE") and steps:
        return int(steps)
    if drafts:
        return max(1, int(drafts) - 1)
    return CHAIN_DEPTH.get(algorithm, 3)


def ddtree_plan(worker_cls, values: dict) -> tuple[str, str, bool]:
    """(greedy verify mode, reason, builds trees) as the deployed DDTree worker would decide.

    The 0.5.13.post1 worker skips the tree when tp > 1 (in `_draft_logits`) and otherwise verifies
    linearly when its `_linear_reason` gives a reason; 0.5.23's worker has no tree path at all.
    """
    if worker_cls is None or not hasattr(worker_cls, "_linear_reason"):
        name = getattr(worker_cls, "__name__", "none")
        return "linear", f"the deployed worker ({name}) has no tree verification", False
    if int(values.get("tp_size") or 1) != 1:
        return "linear", "tp > 1 (the worker builds trees with tp == 1 only)", False
    reason = linear_reason(worker_cls, values, greedy=True)
    if reason:
        return ("shadow-linear" if reason == "shadow-linear" else "linear"), reason, True
    return "tree", "", True


def linear_reason(worker_cls, values: dict, *, greedy: bool):
    """Call the deployed worker's own `_linear_reason` on this configuration."""
    fake = types.SimpleNamespace(
        ddtree_shadow_linear=bool(values.get("speculative_ddtree_shadow_linear")),
        page_size=int(values.get("page_size") or 1))
    batch = types.SimpleNamespace(sampling_info=types.SimpleNamespace(is_all_greedy=greedy))
    return worker_cls._linear_reason(fake, batch, True)


def make_plan(algorithm: str, values: dict, worker_cls=None) -> Plan:
    depth = depth_for(algorithm, values)
    plan = Plan(algorithm, depth, worker=_qualname(worker_cls))
    if algorithm == "NONE":
        return plan
    plan.greedy_mode = plan.sampling_mode = "chain"
    if algorithm == "DDTREE":
        plan.budget = int(values.get("speculative_ddtree_budget") or 64)
        cap = values.get("speculative_ddtree_topk_cap")
        plan.topk_cap = int(cap) if cap else None
        plan.greedy_mode, plan.reason, plan.build_tree = ddtree_plan(worker_cls, values)
        if plan.build_tree:
            plan.sampling_mode = ("shadow-linear" if linear_reason(worker_cls, values, greedy=False) == "shadow-linear"
                                  else "linear")
        else:
            plan.sampling_mode = "linear"
    return plan


def _qualname(cls):
    return None if cls is None else f"{cls.__module__}.{cls.__qualname__}"


class Decoder:
    """One request's decoding state lives in a model.Sequence; `step` advances it."""

    def __init__(self, plan: Plan, size: int = 64, ddtree=None, tree_log: str | None = None):
        self.plan, self.size = plan, size
        self.target = model.TargetLM(size)
        self.drafter = model.Drafter(plan.algorithm, self.target) if plan.algorithm != "NONE" else None
        self.du = ddtree
        if plan.build_tree and ddtree is None:
            raise RuntimeError("DDTREE builds trees here but no ddtree_utils was given")
        self.tree_log = tree_log

    def step(self, seq: model.Sequence, temperature: float = 0.0, generator=None) -> Step:
        greedy = temperature <= 0
        mode = self.plan.mode(greedy)
        if mode == "none" or self.plan.depth == 0:
            logits = self.target.logits([seq.digests[-1]])
            return Step([self._choose(logits, temperature, generator)[0]], 0, 1, 0, "none")
        draft = self.drafter.draft_logits(seq, self.plan.depth)
        if mode == "tree":
            return self._tree_step(seq, draft)
        summary = self._build_tree(seq, draft)["summary"] if self.plan.build_tree else None
        step = self._chain_step(seq, draft, temperature, generator)
        step.mode, step.tree = mode, summary
        return step

    # -- chain: the drafter's top-1 per position, verified in order
    def _chain_step(self, seq, draft, temperature, generator) -> Step:
        chain = draft.argmax(dim=-1).tolist()
        digests, digest = [], seq.digests[-1]
        for k, tok in enumerate(chain):
            digests.append(digest)
            digest = model.fold(digest, len(seq) + k, tok)
        digests.append(digest)
        picks = self._choose(self.target.logits(digests), temperature, generator)
        accepted = 0
        while accepted < len(chain) and chain[accepted] == picks[accepted]:
            accepted += 1
        return Step(chain[:accepted] + [picks[accepted]], accepted, len(chain) + 1, len(chain), "chain")

    # -- tree: the deployed build_ddtree, visibility_mask, position_ids and verify_greedy
    def _build_tree(self, seq, draft) -> dict:
        import torch

        root = torch.tensor([seq.tokens[-1]], dtype=torch.long)
        tree = self.du.build_ddtree(draft.unsqueeze(0), self.plan.budget, self.plan.topk_cap, root_tokens=root)
        summary = self.du.tree_summary(tree)
        if self.tree_log:
            with open(self.tree_log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"mode": self.plan.greedy_mode, **summary}) + "\n")
        return {"tree": tree, "summary": summary}

    def _tree_step(self, seq, draft) -> Step:
        import torch

        built = self._build_tree(seq, draft)
        tree = built["tree"]
        start = torch.tensor([len(seq) - 1], dtype=torch.long)   # the root is the last committed token
        mask = self.du.visibility_mask(tree)[0].tolist()
        positions = self.du.position_ids(tree, start)[0].tolist()
        # What the worker feeds the target: padding slots carry the root token.
        tokens = torch.where(tree.valid, tree.tokens, tree.tokens[:, :1].expand_as(tree.tokens))[0].tolist()
        base = seq.digests[-2]                                    # the KV cache: committed minus the root
        digests = []
        for row in mask:
            seen = [(positions[j], tokens[j]) for j, visible in enumerate(row) if visible]
            digests.append(model.fold_pairs(base, seen))
        logits = self.target.logits(digests).unsqueeze(0)
        walk = self.du.verify_greedy(tree, logits)
        accepted = int(walk.accept_length[0])
        emitted = [int(t) for t in walk.accepted_tokens[0, :accepted].tolist()] + [int(walk.bonus[0])]
        return Step(emitted, accepted, int(tree.num_nodes), int(draft.shape[0]), "tree", built["summary"])

    def _choose(self, logits, temperature: float, generator) -> list[int]:
        if temperature <= 0:
            return logits.argmax(dim=-1).tolist()
        import torch

        probs = torch.softmax(logits / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).view(-1).tolist()


def step_cost(step: Step, costs: dict | None = None) -> float:
    """The step's time in units of one single-token target forward (see the module docstring)."""
    c = {**COSTS, **(costs or {})}
    return 1.0 + float(c["verify_node_cost"]) * (step.verified - 1) + float(c["draft_token_cost"]) * step.drafted


def decode(decoder: Decoder, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
           generator=None, on_step=None):
    """Run to max_new_tokens; returns (output ids, steps). on_step(out, steps) after each step."""
    seq = model.Sequence(prompt_ids or [0])
    out, steps = [], []
    while len(out) < max_new_tokens:
        step = decoder.step(seq, temperature, generator)
        emitted = step.emitted[: max_new_tokens - len(out)]
        seq.extend(emitted)
        out.extend(emitted)
        steps.append(step)
        if on_step:
            on_step(out, steps)
    return out, steps


def tree_log_path() -> str | None:
    """SGLANG_DDTREE_LOG as the worker reads it: a path, or "0"/"" for none."""
    value = os.environ.get("SGLANG_DDTREE_LOG", "0")
    return None if value in ("", "0") else value

"""Sizing the decode/verify CUDA graph when the new algorithm verifies more tokens per request.

sglang captures the target-verify graph for `max_bs` requests of `num_tokens_per_bs` tokens each
(0.5.13.post1: model_executor/cuda_graph_runner.py:519-542, speculative/spec_info.py:151-159; 0.5.23:
model_executor/runner/decode_cuda_graph_runner.py:359 and 424-428), so its buffers hold
max_bs x tokens. A baseline sized for a 4-token draft (`--cuda-graph-max-bs 128`) would ask a
65-node DDTree verify for 16x the tokens per graph.

What the baseline's graph is, as sglang settles it (graph_of, per_rank): its max bs is the
`--cuda-graph-bs` list's largest entry, else the operator's `--cuda-graph-max-bs`, else sglang's own
choice from the smallest GPU's memory (nvidia-smi memory.total, as sglang reads it) and TP
(`sglang_max_bs`, checked against the real 0.5.13.post1 code by tests/unit/test_graphsize.py), else,
on a host without GPU facts (the lab), its fallback of 160, said in the note. Its memory is sized
for max bs x the baseline's width. Both versions capture no more than the request pool, which is
the per-rank concurrency: --max-running-requests split over attention-DP ranks, or sglang's own
default (2048 or more on any real pool) when not given. A batch above the captured max runs
entirely without graphs.

The policy (the playbook's `launch.cuda_graph`): when the new width at the graph's coverage fits
the baseline's memory, nothing changes. Otherwise `keep` leaves it (an out-of-memory at capture is
loud: probes fail and the deploy reverts); `refuse` stops at preflight; not set (the default), an
explicit size is the operator's tuning and is kept, so it is refused in one line saying what fits
(a smaller verify, `rescale` with the max bs it gives and what that costs, or `keep`); sglang's own
default is rescaled only where the graph keeps covering the requests per rank it covered, which
with GPU facts means refused likewise. Without GPU facts (the lab) the fallback's real size is
unknown, so the default is rescaled, the note says what it costs, and the throughput gate at the
serving concurrency is the check. `rescale` is the operator accepting that cost: explicit or
default, the size is lowered to what fits and the note names the batches that lose their graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from packaging.version import Version

from fleetspec.errors import UserError
from fleetspec.model.launch import Derived, OptionTable, sglang_version

POLICIES = ("keep", "rescale", "refuse")
# The option per version: 0.5.13.post1 --cuda-graph-max-bs, 0.5.23 --cuda-graph-max-bs-decode.
GRAPH_BS_DESTS = ("cuda_graph_max_bs", "cuda_graph_max_bs_decode")
GRAPH_LIST_DESTS = ("cuda_graph_bs", "cuda_graph_bs_decode")
# sglang's max bs when it cannot read the GPU's memory (0.5.13.post1 server_args.py:1530-1531,
# 0.5.23 arg_groups/memory_hook.py:180); with a GPU it picks 8..512 from memory and TP
# (server_args.py:1468-1525, memory_hook.py:95-176).
SGLANG_DEFAULT_BS = 160
# sglang's own max bs by the smallest GPU's memory (MiB, upper bound exclusive): (bound, TP < 4, TP >= 4).
# 0.5.13.post1 server_args.py:1468-1525 (_handle_gpu_memory_settings); 0.5.23
# arg_groups/memory_hook.py:89-176 (its 20-35 GiB row became 48/160), which then caps a default at
# --max-running-requests (memory_hook.py:182-187).
_BS_0_5_13 = ((20 * 1024, 8, 8), (35 * 1024, 24, 80), (60 * 1024, 32, 160), (90 * 1024, 256, 512),
              (160 * 1024, 256, 512), (float("inf"), 512, 512))
_BS_0_5_23 = ((20 * 1024, 8, 8), (35 * 1024, 48, 160), (60 * 1024, 32, 160), (90 * 1024, 256, 512),
              (160 * 1024, 256, 512), (float("inf"), 512, 512))
DRAFT_TOKENS = "speculative_num_draft_tokens"
# How many tokens per request a verify pass takes, from the value of the flag that sets it.
WIDTH_OF: dict[str, Callable[[int], int]] = {"speculative_ddtree_budget": lambda v: v + 1,      # root + budget nodes (ddtree_utils)
                                             DRAFT_TOKENS: lambda v: v}


def _older_than_0_5_14(version: str) -> bool:
    """PEP 440's order (0.5.13.post1 and 0.5.14rc1 are older; a string that is no version is not)."""
    v = sglang_version(version)
    return v is not None and v < Version("0.5.14")


def sglang_max_bs(version: str, gpu_mem: float | None, tp: int, max_running: int | None = None) -> int:
    """The decode/verify graph's max bs sglang `version` picks when the flag is not given; 0.5.23 caps
    that default at the (global) --max-running-requests (arg_groups/memory_hook.py:182-187)."""
    if gpu_mem is None:
        bs = SGLANG_DEFAULT_BS
    else:
        rows = _BS_0_5_13 if _older_than_0_5_14(version) else _BS_0_5_23
        bound, small, large = next(r for r in rows if gpu_mem < r[0])
        bs = small if tp < 4 else large
    if not _older_than_0_5_14(version) and max_running is not None and bs > max_running:
        bs = max_running
    return bs


# sglang's own request pool per rank when --max-running-requests is not given: between these, by
# token capacity / context length, and at most token capacity / 2 (see sglang_max_running).
RUNNING_FLOOR, RUNNING_CEILING = 2048, 4096


def sglang_max_running(version: str, token_capacity: int, context_len: int, max_running: int | None,
                       dp: int) -> int:
    """Requests one attention rank runs at once (its request pool, which is also the most its CUDA
    graph captures), as sglang `version` settles it after profiling the KV pool (`token_capacity`
    tokens). 0.5.13.post1 model_executor/model_runner_kv_cache_mixin.py:876-889
    (_resolve_max_num_reqs: min(max_running // dp, estimate) when given, else min(estimate,
    capacity // 2), the estimate between 2048 and 4096); 0.5.23 mem_cache/kv_cache_configurator.py:
    3119-3132 (max(1, max_running // dp) capped at capacity // 2). A hybrid model's state pool can
    lower it further (both: the mambaish branch right after), which is not knowable before start."""
    estimated = max(min(int(token_capacity / context_len * 512), RUNNING_CEILING), RUNNING_FLOOR)
    if max_running is None:
        return min(estimated, token_capacity // 2)
    if _older_than_0_5_14(version):
        return min(max_running // dp, estimated)
    return min(max(1, max_running // dp), token_capacity // 2)


def attention_dp(named: Mapping[str, str | None], version: str) -> int:
    """Attention-DP ranks: each serves max_running // dp requests and captures its own graph.
    0.5.13.post1 model_executor/model_runner.py:396 (dp_size if enable_dp_attention else 1);
    0.5.23 arg_groups/parallel_hook.py:49-57 (--dp-size N --enable-dp-attention becomes
    attn_dp_size N) or its own --attn-dp-size. Plain --dp-size replicas each get the whole
    --max-running-requests."""
    dp = _int(named.get("dp_size")) or 1
    own = _int(named.get("attn_dp_size")) or 1
    if not _older_than_0_5_14(version) and own > 1:
        return own
    return dp if "enable_dp_attention" in named else 1


@dataclass(frozen=True)
class Concurrency:
    """Requests one attention rank runs at once, known before start: `value` exactly (at most:
    sglang lowers it only for a KV or state pool too small), or at least `value` (`bound`)."""
    value: int
    bound: bool
    source: str

    def said(self) -> str:
        return f"{'at least ' if self.bound else ''}{self.value} per rank ({self.source})"


def per_rank(named: Mapping[str, str | None], version: str) -> Concurrency:
    """The per-rank concurrency before start (sglang_max_running without the profiled capacity)."""
    running, dp = _int(named.get("max_running_requests")), attention_dp(named, version)
    ranks = f" over {dp} attention-DP ranks" if dp > 1 else ""
    if running:
        return Concurrency(max(1, running // dp), False, f"--max-running-requests {running}{ranks}")
    return Concurrency(RUNNING_FLOOR, True, "sglang's default without --max-running-requests: 2048 to 4096 by KV "
                                            "capacity, unless the KV pool holds under 4096 tokens or a hybrid "
                                            "model's state pool is smaller")


@dataclass(frozen=True)
class Graph:
    """The baseline's decode/verify graph: `max_bs` as sglang settles it (what its memory is sized
    for), where it came from, the explicit item's dest (None: sglang's own choice), and the
    requests per rank it covers: capture stops at the request pool in both versions (0.5.13.post1
    model_executor/cuda_graph_runner.py:389-415, 0.5.23 runner/base_cuda_graph_runner.py:64-99),
    and a batch larger than the captured max runs entirely without graphs (cuda_graph_runner.py:663,
    decode_cuda_graph_runner.py:890), not only the requests beyond it."""
    max_bs: int
    source: str
    explicit: str | None
    coverage: int


def graph_of(kept: Sequence[Sequence[str]], table: OptionTable, gpu_mem: float | None,
             running: Concurrency) -> Graph | None:
    """The baseline's graph (see Graph); None when the version has no graph option in its table.
    A --cuda-graph-bs list (0.5.23: --cuda-graph-bs-decode) sets the max bs to its largest entry
    (0.5.13.post1 server_args.py:1536-1538, 0.5.23 arg_groups/memory_hook.py:205-207), over any
    --cuda-graph-max-bs."""
    option = _graph_option(table)
    if option is None:
        return None
    named = given(kept, table)
    tp = _int(named.get("tp_size")) or 1
    listed = _list_of(kept, table)
    written = _int(named.get(table.options[option][0]))
    if listed:
        bs, source, explicit = max(listed[1]), f"the largest of {listed[0]} {' '.join(map(str, listed[1]))}", "list"
    elif written is not None:
        bs, source, explicit = written, "set in the baseline", table.options[option][0]
    else:
        mrr = _int(named.get("max_running_requests"))
        bs, explicit = sglang_max_bs(table.version, gpu_mem, tp, mrr), None
        source = (f"sglang {table.version}'s own choice for {gpu_mem:.0f} MiB GPUs at TP {tp}" if gpu_mem is not None
                  else "no GPU facts on this host: sglang's fallback without GPU memory (the real size is unknown)")
        if bs < sglang_max_bs(table.version, gpu_mem, tp):
            source += f", capped at --max-running-requests {mrr}"
    return Graph(bs, source, explicit, min(bs, running.value) if not running.bound else bs)


def _list_of(kept: Sequence[Sequence[str]], table: OptionTable) -> tuple[str, list[int]] | None:
    """(option as written, sizes) of the last --cuda-graph-bs item (nargs '+')."""
    found = None
    for tokens in kept:
        dest, _, explicit = _item(tokens, table)
        if dest in GRAPH_LIST_DESTS:
            words = [tokens[0].split("=", 1)[1], *tokens[1:]] if explicit else list(tokens[1:])
            sizes = [int(w) for w in words if w.isdigit()]
            if sizes:
                found = (tokens[0].split("=", 1)[0], sizes)
    return found


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


@dataclass(frozen=True)
class GraphSizing:
    derived: Derived
    note: str | None


def _item(tokens: Sequence[str], table: OptionTable) -> tuple[str | None, str | None, bool]:
    """(dest, value, written with `=`) of one whole item, resolved as argparse resolves it."""
    found = table.resolve(tokens[0]) if tokens and tokens[0].startswith("-") else None
    option, explicit, verdict = found if found else (None, None, "")
    if option is None or verdict != "ok":
        return None, None, False
    value = explicit if explicit is not None else (tokens[1] if len(tokens) > 1 else None)
    return table.options[option][0], value, explicit is not None


def _values(tokens_list: Sequence[Sequence[str]], table: OptionTable) -> dict[str, str]:
    """dest -> value (last wins) of whole items."""
    out: dict[str, str] = {}
    for tokens in tokens_list:
        dest, value, _ = _item(tokens, table)
        if dest and value is not None:
            out[dest] = value
    return out


# 0.5.13.post1's dests for the parallel sizes, by 0.5.23's (and this module's) names
DEST_ALIASES = {"tensor_parallel_size": "tp_size", "pipeline_parallel_size": "pp_size", "data_parallel_size": "dp_size"}


def given(tokens_list: Sequence[Sequence[str]], table: OptionTable) -> dict[str, str | None]:
    """dest -> value (last wins; None for a flag without one) of whole items; the parallel sizes
    under 0.5.23's names (tp_size, pp_size, dp_size) in both versions."""
    out: dict[str, str | None] = {}
    for tokens in tokens_list:
        dest, value, _ = _item(tokens, table)
        if dest:
            out[DEST_ALIASES.get(dest, dest)] = value
    return out


def _pairs(flags: Sequence[str]) -> list[list[str]]:
    """A playbook's flat flag list cut into items at each option word."""
    items: list[list[str]] = []
    for token in flags:
        if token.startswith("-") or not items:
            items.append([token])
        else:
            items[-1].append(token)
    return items


def baseline_width(dropped: Sequence[Sequence[str]], table: OptionTable, algorithm: str | None) -> int | None:
    """Tokens per request the baseline verified: its num_draft_tokens; num_steps + 1 with topk 1
    (what sglang derives then); 1 without speculation (plain decode); None when unknown."""
    if algorithm is None and not dropped:
        return 1
    spec = _values(dropped, table)
    if DRAFT_TOKENS in spec:
        return int(spec[DRAFT_TOKENS])
    if spec.get("speculative_eagle_topk") == "1" and "speculative_num_steps" in spec:
        return int(spec["speculative_num_steps"]) + 1
    return None


def new_width(values: Mapping[str, Any], table: OptionTable) -> int | None:
    """Tokens per request the new launch verifies, from its flags' values (ops/flags.Flags.values:
    the playbook's option values as rendered from, not the text). The patch set's own options
    (--speculative-ddtree-budget) are not in the installed parser's table: known by their name."""
    width = None
    for option, value in values.items():
        found = table.resolve(option)
        dest = (table.options[found[0]][0] if found and found[0] and found[2] == "ok"
                else option.lstrip("-").replace("-", "_"))
        count = value if isinstance(value, int) and not isinstance(value, bool) else (
            int(value) if isinstance(value, str) and value.isdigit() else None)
        if dest in WIDTH_OF and count is not None:
            width = WIDTH_OF[dest](count)
    return width


def _graph_option(table: OptionTable) -> str | None:
    for option, (dest, _nargs) in table.options.items():
        if dest in GRAPH_BS_DESTS and option.startswith("--"):
            return option
    return None


def size(derived: Derived, table: OptionTable, policy: str | None, where: str,
         values: Mapping[str, Any] | None = None, gpu_mem: float | None = None) -> GraphSizing:
    """Apply the playbook's cuda_graph policy (None: not set) to a derived launch (see the module
    docstring); `values`: the new flags' values (new_width); `gpu_mem`: the smallest GPU's
    memory.total in MiB from the host's nvidia-smi, None without GPU facts. The note says the
    per-rank concurrency, what the graph covers and where each came from."""
    option = _graph_option(table)
    if option is None or any(_item(t, table)[0] == "disable_cuda_graph" for t in derived.kept):
        return GraphSizing(derived, None)
    wide, base = new_width(values or {}, table), baseline_width(derived.dropped, table, derived.algorithm)
    if wide is None:
        return GraphSizing(derived, None)
    if base is None:
        return GraphSizing(derived, f"{option} left as it is: the baseline's verify width is unknown "
                                    f"(no --speculative-num-draft-tokens)")
    running = per_rank(given(derived.kept, table), table.version)
    graph = graph_of(derived.kept, table, gpu_mem, running)
    assert graph is not None
    bs, cov, budget = graph.max_bs, graph.coverage, graph.max_bs * base
    named_bs = f"{option} {bs} ({graph.source})"
    capped = ", capped at the request pool" if cov < bs else ""
    covers = f"{named_bs} covers batches of up to {cov} requests per rank{capped}; concurrency {running.said()}"
    if cov * wide <= budget:
        return GraphSizing(derived, f"{covers}; the new launch captures {cov} x {wide} = {cov * wide} <= {bs} x "
                                    f"{base} = {budget} verify tokens: {option} kept")
    if policy == "keep":
        return GraphSizing(derived, f"{covers}; the new launch captures {cov} x {wide} = {cov * wide} verify tokens "
                                    f"where the baseline's graph memory holds {bs} x {base} = {budget}: kept "
                                    f"(launch.cuda_graph: keep); an out-of-memory at capture fails the probes and "
                                    f"the deploy reverts")
    fits, fit_width = budget // wide, budget // cov
    new = max(1, fits)
    at_once = f"{running.value}{' or more' if running.bound else ''}"
    cost = f"batches of more than {new} requests per rank then run entirely without CUDA graphs, at up to {at_once} at once"
    width_hint = f"a verify of at most {fit_width} tokens per request" + (
        f" (ddtree: --set budget={fit_width - 1})" if fit_width > 1 else "")
    lower = (f"launch.cuda_graph: rescale, to {option} {new} ({cost})" if fits >= 1 else
             f"no {option} holds even one request of {wide} tokens within {budget}")
    refusal = (f"{where}: {named_bs} holds {bs} x {base} = {budget} verify tokens; the new launch verifies {wide} "
               f"per request, and its graph would capture {cov} x {wide} = {cov * wide} (it covers {cov} requests "
               f"per rank{capped}; concurrency {running.said()}). Fits: {width_hint}; or {lower}; or "
               f"launch.cuda_graph: keep (an out-of-memory at capture fails the probes and the deploy reverts)")
    if policy == "refuse":
        raise UserError(f"{refusal} (launch.cuda_graph: refuse)")
    if policy is None and graph.explicit is not None:
        raise UserError(f"{refusal} (launch.cuda_graph not set: an explicit graph size is kept)")
    if policy is None and gpu_mem is not None:
        raise UserError(f"{refusal} (launch.cuda_graph not set: sglang's own size is rescaled only where the "
                        f"graph keeps covering the {cov} requests per rank it covered)")
    said = (f"{covers}; the new launch verifies {wide} per request: {option} {bs} -> {new} "
            + (f"({new} x {wide} = {new * wide} <= {budget})" if fits >= 1 else
               f"(the smallest graph: 1 x {wide} = {wide} is still more than {budget})"))
    if new < cov:
        said += f"; {cost.replace(' then ', ' now ')}" + (
            ": without GPU facts the throughput gate at the serving concurrency is the check" if gpu_mem is None
            else " (launch.cuda_graph: rescale)")
    if graph.explicit == "list":
        return GraphSizing(_with_list(derived, table, new), said)
    return GraphSizing(_with_bs(derived, option, table.options[option][0], new, table), said)


def _with_list(derived: Derived, table: OptionTable, bs: int) -> Derived:
    """The --cuda-graph-bs list cut at `bs` (its entries below it, then `bs`), rewritten in place:
    sglang takes the max bs from the list, so a --cuda-graph-max-bs beside it would be overwritten."""
    argv, kept, changed = list(derived.argv), [list(t) for t in derived.kept], list(derived.changed)
    for tokens in kept:
        found, _, explicit = _item(tokens, table)
        if found not in GRAPH_LIST_DESTS:
            continue
        words = [tokens[0].split("=", 1)[1], *tokens[1:]] if explicit else list(tokens[1:])
        sizes = sorted({int(w) for w in words if w.isdigit() and int(w) < bs} | {bs})
        head = tokens[0].split("=", 1)[0]
        new = ([f"{head}={sizes[0]}", *map(str, sizes[1:])] if explicit else [head, *map(str, sizes)])
        start = _find(argv, tokens)
        argv[start:start + len(tokens)] = new
        changed.append([list(tokens), new])
        tokens[:] = new
    return replace(derived, argv=argv, kept=kept, changed=changed)


def _with_bs(derived: Derived, option: str, dest: str, bs: int, table: OptionTable) -> Derived:
    """The kept item for `dest` rewritten in place (both spellings), or the flag added when absent."""
    argv, kept, changed = list(derived.argv), [list(t) for t in derived.kept], list(derived.changed)
    for tokens in kept:
        found, _, explicit = _item(tokens, table)
        if found != dest:
            continue
        new = [f"{tokens[0].split('=', 1)[0]}={bs}"] if explicit else [tokens[0], str(bs)]
        start = _find(argv, tokens)
        argv[start:start + len(tokens)] = new
        changed.append([list(tokens), new])
        tokens[:] = new
    if len(changed) > len(derived.changed):
        return replace(derived, argv=argv, kept=kept, changed=changed)
    added = [*derived.added, option, str(bs)]
    at = _find(argv, derived.added) + len(derived.added) if derived.added else len(argv)
    return replace(derived, argv=[*argv[:at], option, str(bs), *argv[at:]], added=added)


def _find(argv: list[str], tokens: Sequence[str]) -> int:
    n = len(tokens)
    for i in range(len(argv) - n, -1, -1):
        if argv[i:i + n] == list(tokens):
            return i
    raise ValueError(f"{tokens} not in {argv}")

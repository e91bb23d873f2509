"""Sizing the decode/verify CUDA graph when the new algorithm verifies more tokens per request.

sglang captures the target-verify graph for `max_bs` requests of `num_tokens_per_bs` tokens each
(0.5.13.post1: model_executor/cuda_graph_runner.py:519-542, speculative/spec_info.py:151-159; 0.5.23:
model_executor/runner/decode_cuda_graph_runner.py:359 and 424-428), so its buffers hold
max_bs x tokens. A baseline sized for a 4-token draft (`--cuda-graph-max-bs 128`) would ask a
65-node DDTree verify for 16x the tokens per graph. The playbook's `launch.cuda_graph` says what to
do: `rescale` lowers the max batch size so that bs x tokens stays within the baseline's, `refuse`
stops at preflight, `keep` leaves it (the default; said in the plan).

The baseline's size is what that sglang version picks on that host: the operator's value, else its
own choice from the smallest GPU's memory (nvidia-smi memory.total, as sglang reads it) and TP
(`sglang_max_bs`, checked against the real 0.5.13.post1 code by tests/unit/test_graphsize.py), else,
on a host without GPU facts (the lab), its fallback of 160, said in the note. With GPU facts a
rescale that leaves fewer requests per graph than the host serves at once (--max-running-requests)
is refused, saying what would fit; without them the note says so and the throughput gate at that
concurrency is the check.
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
    """The decode/verify graph's max bs sglang `version` picks when the flag is not given."""
    if gpu_mem is None:
        bs = SGLANG_DEFAULT_BS
    else:
        rows = _BS_0_5_13 if _older_than_0_5_14(version) else _BS_0_5_23
        bound, small, large = next(r for r in rows if gpu_mem < r[0])
        bs = small if tp < 4 else large
    if not _older_than_0_5_14(version) and max_running is not None and bs > max_running:
        bs = max_running
    return bs


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


def size(derived: Derived, table: OptionTable, policy: str, where: str,
         values: Mapping[str, Any] | None = None, gpu_mem: float | None = None) -> GraphSizing:
    """Apply the playbook's cuda_graph policy to a derived launch (see the module docstring);
    `values`: the new flags' values (new_width); `gpu_mem`: the smallest GPU's memory.total in MiB
    from the host's nvidia-smi, None without GPU facts."""
    option = _graph_option(table)
    kept = _values(derived.kept, table)
    if policy == "keep" or option is None or any(_item(t, table)[0] == "disable_cuda_graph" for t in derived.kept):
        return GraphSizing(derived, None)
    wide, base = new_width(values or {}, table), baseline_width(derived.dropped, table, derived.algorithm)
    if wide is None:
        return GraphSizing(derived, None)
    if base is None:
        return GraphSizing(derived, f"{option} left as it is: the baseline's verify width is unknown "
                                    f"(no --speculative-num-draft-tokens)")
    dest = table.options[option][0]
    written = kept.get(dest)
    named = given(derived.kept, table)
    tp, running = _int(named.get("tp_size")) or 1, _int(named.get("max_running_requests"))
    if written is not None:
        bs, source = int(written), "set in the baseline"
    elif gpu_mem is not None:
        bs = sglang_max_bs(table.version, gpu_mem, tp, running)
        source = f"sglang {table.version}'s own choice for {gpu_mem:.0f} MiB GPUs at TP {tp}"
    else:
        bs = sglang_max_bs(table.version, None, tp, running)
        source = "no GPU facts on this host: sglang's fallback without GPU memory (the real size is unknown)"
    fits = max(1, bs * base // wide)
    if fits >= bs:
        return GraphSizing(derived, None)
    said = (f"{option} {bs} ({source}) holds {bs} x {base} = {bs * base} verify tokens; the new launch verifies "
            f"{wide} per request")
    if policy == "refuse":
        raise UserError(f"{where}: {said}; set {option} {fits} or less in the baseline (playbook "
                        f"launch.cuda_graph: refuse)")
    need = min(running, bs) if running else None
    if need is not None and fits < need:
        if gpu_mem is not None:
            raise UserError(f"{where}: {said}, so {fits} requests per graph fit, below the {need} the host serves at "
                            f"once (--max-running-requests {running}): requests beyond {fits} would run without "
                            f"CUDA graphs. A launch of at most {bs * base // need} verify tokens per request fits "
                            f"(ddtree: --set budget={bs * base // need - 1}); or raise {option} in the baseline, or "
                            f"set launch.cuda_graph: keep")
        said += (f"; {fits} requests per graph is below the {need} the host serves at once: without GPU facts the "
                 f"throughput gate at that concurrency is the check")
    return GraphSizing(_with_bs(derived, option, dest, fits, table),
                       f"{said}: {option} {bs} -> {fits} ({fits} x {wide} = {fits * wide} <= {bs * base})")


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

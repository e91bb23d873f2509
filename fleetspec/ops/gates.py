"""Gates: measured conditions a release must meet to be kept.

A speculative decoder that starts but accepts fewer tokens, runs slower, or changes greedy output
is a regression no health check sees. Each gate compares the release with the same host's
figures measured on the running service just before the switch (same prompts, same load), and
returns pass, fail or inconclusive. Inconclusive (no data, errors, too few samples) fails closed
unless the gate is `dry_run`, which records and never blocks.

Every answer counts: a `/generate` that failed or came back malformed (no `output_ids` list of
token ids, one whose length is not the answer's own completion count, an accept length that is not
a finite number >= 0, no completion count) is an error, never a skipped prompt or an empty output, and any error makes acceptance and parity inconclusive; parity compares
whole id lists, lengths included.
"""

from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fleetspec.errors import FleetspecError, RemoteError
from fleetspec.remote import sglang_api

GOLDEN_PROMPTS = (
    "The capital of France is",
    "Write a Python function that reverses a linked list.",
    "Explain speculative decoding in two sentences.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into German.",
    "What is the derivative of x^3 + 2x?",
    "Summarise the plot of Hamlet in one line.",
    "def fibonacci(n):",
)
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
MIN_SAMPLES = 3


@dataclass
class Verdict:
    name: str
    verdict: str
    reason: str = ""
    figures: dict = field(default_factory=dict)
    dry_run: bool = False

    @property
    def blocks(self) -> bool:
        return self.verdict != PASS and not self.dry_run


@dataclass
class Measurement:
    """What one run of the prompt set (and optional load) showed on a service."""

    outputs: dict[str, list] = field(default_factory=dict)     # prompt -> output ids (greedy)
    texts: dict[str, str] = field(default_factory=dict)
    accept_lengths: list[float] = field(default_factory=list)
    tokens_per_s: dict[int, float] = field(default_factory=dict)   # concurrency -> output tok/s
    tpot_ms: dict[int, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)           # every failed/malformed answer
    prompt_errors: list[str] = field(default_factory=list)    # … of the golden prompts
    asked: int | None = None                                  # golden prompts sent (None: unknown)

    def figures(self) -> dict:
        out: dict[str, float] = {"requests_failed": len(self.errors)}
        if self.accept_lengths:
            out["accept_length"] = round(statistics.fmean(self.accept_lengths), 3)
        for c, v in self.tokens_per_s.items():
            out[f"tok_s_c{c}"] = round(v, 1)
        for c, v in self.tpot_ms.items():
            out[f"tpot_ms_c{c}"] = round(v, 2)
        return out


def _generate(t, port: int, prompt: str, max_new_tokens: int, api_key: str | None) -> dict:
    started = time.monotonic()
    data = sglang_api.generate(t, port, prompt, max_new_tokens, api_key=api_key, timeout=300)
    check_answer(data)
    data["_wall"] = time.monotonic() - started
    return data


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_answer(data) -> None:
    """ValueError unless a /generate answer has what the gates read: `output_ids` (a list of token
    ids, as many as `meta_info.completion_tokens` says: two empty lists would otherwise compare
    equal for texts that differ), a `meta_info` object whose `completion_tokens` is a count and
    whose `spec_accept_length`, where present, is a finite number >= 0."""
    if not isinstance(data, dict):
        raise ValueError("malformed answer: not a JSON object")
    ids = data.get("output_ids")
    if not isinstance(ids, list) or not all(_is_int(x) for x in ids):
        raise ValueError("malformed answer: no output_ids list of token ids")
    meta = data.get("meta_info")
    if not isinstance(meta, dict):
        raise ValueError("malformed answer: no meta_info object")
    if not _is_int(meta.get("completion_tokens")) or meta["completion_tokens"] < 0:
        raise ValueError("malformed answer: meta_info.completion_tokens is not a count")
    if len(ids) != meta["completion_tokens"]:
        raise ValueError(f"malformed answer: {len(ids)} output_ids for meta_info.completion_tokens "
                         f"{meta['completion_tokens']}")
    accept = meta.get("spec_accept_length")
    if accept is not None and (not isinstance(accept, (int, float)) or isinstance(accept, bool)
                               or not math.isfinite(accept) or accept < 0):
        # JSON's NaN and Infinity parse as floats: a mean with one of them passes any floor
        raise ValueError("malformed answer: meta_info.spec_accept_length is not a finite number >= 0")


def measure(t, port: int, *, prompts=GOLDEN_PROMPTS, max_new_tokens: int = 32, concurrency=(), requests: int = 16,
            api_key: str | None = None, rounds: int = 2) -> Measurement:
    """Greedy outputs and acceptance for the golden prompts, then tokens/s at each concurrency:
    the faster of `rounds` rounds, since whatever else runs on the host (or the machine) can only
    ever slow a round down: one unlucky round must not fail a release. Baseline and release are
    measured alike, so the ratio stays fair."""
    m = Measurement(asked=len(prompts))
    for prompt in prompts:
        try:
            data = _generate(t, port, prompt, max_new_tokens, api_key)
        except (RemoteError, ValueError) as err:
            m.errors.append(f"{prompt[:20]!r}: {err}")
            m.prompt_errors.append(m.errors[-1])
            continue
        meta = data["meta_info"]
        m.outputs[prompt] = list(data["output_ids"])
        m.texts[prompt] = data.get("text", "")
        if meta.get("spec_accept_length") is not None:
            m.accept_lengths.append(float(meta["spec_accept_length"]))
    for level in concurrency:
        n = max(requests, level)       # a level above the request count would never be reached
        for _ in range(max(1, rounds)):
            tokens, walls, errors = _load(t, port, level, n, max_new_tokens, api_key)
            m.errors.extend(errors)
            if tokens and walls and tokens / walls[0] > m.tokens_per_s.get(level, 0.0):
                m.tokens_per_s[level] = tokens / walls[0]
                m.tpot_ms[level] = 1000 * walls[1] / max(1, tokens / max(1, n - len(errors)))
    return m


def _load(t, port, level, requests, max_new_tokens, api_key):
    """`requests` generations, `level` at a time; (output tokens, (wall, mean latency)), errors."""
    prompts = [f"{GOLDEN_PROMPTS[i % len(GOLDEN_PROMPTS)]} (#{i})" for i in range(requests)]
    errors, latencies, tokens = [], [], 0
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=level) as pool:
        for fut in [pool.submit(_generate, t, port, p, max_new_tokens, api_key) for p in prompts]:
            try:
                data = fut.result()
                tokens += data["meta_info"]["completion_tokens"]
                latencies.append(data["_wall"])
            except (RemoteError, ValueError) as err:
                errors.append(str(err))
    wall = time.monotonic() - started
    return tokens, ((wall, statistics.fmean(latencies)) if latencies else None), errors


def for_host(gates, host):
    """The playbook's gates with the host's overrides (inventory `vars.extra.gates`, e.g.
    `{throughput: {min_ratio: 0.6}}` for a host whose load is known to be noisy)."""
    import dataclasses

    from fleetspec.errors import ConfigError

    overrides = host.vars.extra.get("gates") or {}
    where = f"hosts.{host.name}.vars.extra.gates"
    if not isinstance(overrides, dict):
        raise ConfigError(host.inventory_path, where, "expected a mapping of gate name -> settings")
    out = gates
    for name, settings in overrides.items():
        current = getattr(gates, name, None) if name in ("acceptance", "throughput", "parity") else None
        if current is None or not isinstance(settings, dict):
            raise ConfigError(host.inventory_path, f"{where}.{name}",
                              "expected a gate the playbook has (acceptance, throughput, parity) with settings")
        fields = {f.name: f.type for f in dataclasses.fields(current)}
        unknown = set(settings) - set(fields)
        if unknown:
            raise ConfigError(host.inventory_path, f"{where}.{name}.{sorted(unknown)[0]}",
                              f"unknown setting (known: {', '.join(fields)})")
        out = dataclasses.replace(out, **{name: dataclasses.replace(current, **settings)})
    return out


def serving_level(g, max_running: int | None) -> tuple[int | None, str]:
    """The host's serving concurrency the throughput gate also measures at, and where it came
    from: the playbook's (or host's) `serving_concurrency` (0: not measured), else the launch's
    --max-running-requests; at most `max_concurrency`. (None, why) when there is none."""
    if g.serving_concurrency == 0:
        return None, "serving_concurrency: 0"
    if g.serving_concurrency:
        level, source = g.serving_concurrency, f"serving_concurrency {g.serving_concurrency}"
    elif max_running:
        level, source = max_running, f"--max-running-requests {max_running}"
    else:
        return None, "no --max-running-requests in the launch and no serving_concurrency"
    if level > g.max_concurrency:
        return g.max_concurrency, f"{source}, capped at max_concurrency {g.max_concurrency}"
    return level, source


def at_serving(gates, max_running: int | None):
    """(the gates with the serving level added to the throughput gate's levels, (level, source) or None)."""
    import dataclasses

    if not gates.throughput:
        return gates, None
    level, source = serving_level(gates.throughput, max_running)
    if level is None:
        return gates, None
    levels = tuple(sorted({*gates.throughput.concurrency, level}))
    return dataclasses.replace(gates, throughput=dataclasses.replace(gates.throughput, concurrency=levels)), \
        (level, source)


def _resolved(pf):
    """The playbook's gates for this host, at its serving concurrency."""
    return at_serving(for_host(pf.playbook.gates, pf.host), getattr(getattr(pf, "launch", None), "max_running", None))


def plan_note(pf) -> str | None:
    """The plan's line on the throughput gate's levels: which one is the host's serving concurrency."""
    if not pf.playbook.gates.throughput:
        return None
    g, serving = _resolved(pf)
    levels = ", ".join(map(str, g.throughput.concurrency))
    if serving:
        return f"throughput gate at concurrency {levels} ({serving[0]}: the host's serving concurrency, {serving[1]})"
    _, why = serving_level(g.throughput, getattr(getattr(pf, "launch", None), "max_running", None))
    return f"throughput gate at concurrency {levels}; not at the host's serving concurrency ({why})"


def needs_baseline(gates) -> bool:
    return bool(gates.throughput or gates.parity or (gates.acceptance and gates.acceptance.vs_baseline_tolerance))


def judge(gates, before: Measurement | None, after: Measurement, *, hybrid: bool,
          serving: tuple[int, str] | None = None) -> list[Verdict]:
    """Pure: the verdicts of the playbook's gates on two measurements; `serving`: the host's
    serving concurrency among the throughput gate's levels, and where it came from (at_serving)."""
    out = []
    if gates.acceptance:
        out.append(_acceptance(gates.acceptance, before, after))
    if gates.throughput:
        out.append(_throughput(gates.throughput, before, after, serving))
    if gates.parity:
        out.append(_parity(gates.parity, before, after, hybrid))
    return out


def _acceptance(g, before, after) -> Verdict:
    fig = {"accept_length": after.figures().get("accept_length"), "samples": len(after.accept_lengths),
           "requests_failed": len(after.errors)}
    if before and before.accept_lengths:
        fig["baseline_accept_length"] = before.figures()["accept_length"]
    if after.errors:     # the gate that counts request errors for every playbook that has it
        return Verdict("acceptance", INCONCLUSIVE, f"{len(after.errors)} failed or malformed answers "
                                                   f"(first: {after.errors[0]})", fig, g.dry_run)
    if after.asked is not None and len(after.accept_lengths) < after.asked:
        return Verdict("acceptance", INCONCLUSIVE, f"{after.asked - len(after.accept_lengths)} of {after.asked} "
                                                   f"answers carried no spec_accept_length", fig, g.dry_run)
    if len(after.accept_lengths) < MIN_SAMPLES:
        return Verdict("acceptance", INCONCLUSIVE, f"{len(after.accept_lengths)} samples (< {MIN_SAMPLES})", fig, g.dry_run)
    value = fig["accept_length"]
    if g.min is not None and value < g.min:
        return Verdict("acceptance", FAIL, f"accept length {value} < floor {g.min}", fig, g.dry_run)
    if g.vs_baseline_tolerance is not None:
        base = fig.get("baseline_accept_length")
        if base is None:
            return Verdict("acceptance", INCONCLUSIVE, "no baseline acceptance measured", fig, g.dry_run)
        if before.prompt_errors:
            return Verdict("acceptance", INCONCLUSIVE, f"the baseline measurement had {len(before.prompt_errors)} "
                                                       f"failed or malformed answers", fig, g.dry_run)
        if value < base - g.vs_baseline_tolerance:
            return Verdict("acceptance", FAIL, f"accept length {value} < baseline {base} - {g.vs_baseline_tolerance}",
                           fig, g.dry_run)
    return Verdict("acceptance", PASS, "", fig, g.dry_run)


def _throughput(g, before, after, serving=None) -> Verdict:
    fig: dict = {}
    if serving:
        fig["serving_concurrency"], fig["serving_concurrency_from"] = serving
    if before is None:
        return Verdict("throughput", INCONCLUSIVE, "no baseline measured", fig, g.dry_run)
    worst = worst_level = None
    for level in g.concurrency:
        b, a = before.tokens_per_s.get(level), after.tokens_per_s.get(level)
        if not b or a is None:
            return Verdict("throughput", INCONCLUSIVE, f"no figures at concurrency {level}", fig, g.dry_run)
        ratio = a / b
        fig[f"tok_s_c{level}"], fig[f"baseline_tok_s_c{level}"], fig[f"ratio_c{level}"] = round(a, 1), round(b, 1), round(ratio, 3)
        if worst is None or ratio < worst:
            worst, worst_level = ratio, level
    if after.errors:
        return Verdict("throughput", INCONCLUSIVE, f"{len(after.errors)} failed requests", fig, g.dry_run)
    if before.errors:
        return Verdict("throughput", INCONCLUSIVE, f"the baseline measurement had {len(before.errors)} failed "
                                                   f"requests", fig, g.dry_run)
    if g.min_ratio is not None and worst is not None and worst < g.min_ratio:
        where = f"at concurrency {worst_level}"
        if serving and serving[0] == worst_level:
            where += f" (the host's serving concurrency: {serving[1]})"
        return Verdict("throughput", FAIL, f"release/baseline tokens/s {worst:.3f} < {g.min_ratio} {where}",
                       fig, g.dry_run)
    return Verdict("throughput", PASS, "", fig, g.dry_run)


def _parity(g, before, after, hybrid: bool) -> Verdict:
    if before is None or not before.outputs:
        return Verdict("parity", INCONCLUSIVE, "no baseline outputs", {}, g.dry_run)
    tolerance = g.hybrid_tolerance_tokens if hybrid else 0
    compared, worst, missing = 0, None, []
    for prompt, want in before.outputs.items():
        got = after.outputs.get(prompt)
        if got is None:
            missing.append(prompt)
            continue
        compared += 1
        first = next((i for i, (x, y) in enumerate(zip(want, got, strict=False)) if x != y),
                     None if len(want) == len(got) else min(len(want), len(got)))
        # Tokens from the first difference to the end of the longer list: an output that runs
        # past the baseline's differs as surely as one that stops short.
        if first is not None and (max(len(want), len(got)) - first) > tolerance:
            worst = worst or (prompt, first, want[first] if first < len(want) else None,
                              got[first] if first < len(got) else None)
    fig: dict = {"prompts_compared": compared, "requests_failed": len(after.prompt_errors)}
    for side, m in (("baseline", before), ("release", after)):
        if m.prompt_errors:
            return Verdict("parity", INCONCLUSIVE, f"{side}: {len(m.prompt_errors)} failed or malformed answers "
                                                   f"(first: {m.prompt_errors[0]})", fig, g.dry_run)
    if missing or compared < min(MIN_SAMPLES, len(before.outputs)):
        return Verdict("parity", INCONCLUSIVE, f"only {compared} of {len(before.outputs)} prompts compared",
                       fig, g.dry_run)
    if worst:
        prompt, index, want_tok, got_tok = worst
        fig["first_difference"] = {"prompt": prompt, "token_index": index, "baseline": want_tok, "release": got_tok}
        return Verdict("parity", FAIL, f"greedy output differs at token {index} for {prompt!r} "
                                       f"(baseline {want_tok}, release {got_tok})", fig, g.dry_run)
    return Verdict("parity", PASS, "", fig, g.dry_run)


def measure_for(t, pf) -> Measurement:
    """Measure what the host serves now, the way the playbook's gates ask (at concurrency 1 and
    the others they name, and at the host's serving concurrency)."""
    g, _ = _resolved(pf)
    return measure(t, pf.host.vars.api_port, max_new_tokens=g.parity.max_new_tokens if g.parity else 32,
                   concurrency=tuple(g.throughput.concurrency) if g.throughput else (),
                   requests=g.throughput.requests if g.throughput else 0, api_key=pf.probe_spec(None).api_key)


def measure_baseline(t, pf) -> Measurement:
    """measure_for on what the host serves before the switch; any failed or malformed request
    fails it (FleetspecError), so the gates never compare a release against a partial baseline."""
    before = measure_for(t, pf)
    if before.errors:
        raise FleetspecError(f"{len(before.errors)} of the baseline's requests failed or came back malformed "
                             f"(first: {before.errors[0]}); nothing live changed: the gates would compare "
                             f"against a partial baseline")
    return before


def fail_closed_if_simulated(verdicts: list[Verdict], simulated) -> list[Verdict]:
    """SGLANG_SIMULATE_ACC_* in the service's environment fakes acceptance (and so speed) on both
    sides of the comparison: no gate can pass, dry-run ones included (fail closed)."""
    if not simulated:
        return verdicts
    return [Verdict(v.name, INCONCLUSIVE, f"{', '.join(simulated)} is set (simulated acceptance)", v.figures, False)
            for v in verdicts]


def evaluate(t, pf, state, release, *, echo=print) -> list[Verdict]:
    after = measure_for(t, pf)
    g, serving = _resolved(pf)
    verdicts = judge(g, pf.before, after, hybrid=pf.hybrid, serving=serving)
    verdicts = fail_closed_if_simulated(verdicts, getattr(getattr(pf, "launch", None), "simulated", ()))
    for v in verdicts:
        echo(f"[{pf.host.name}] gate {v.name}: {v.verdict}{' (dry run)' if v.dry_run else ''}"
             f"{' — ' + v.reason if v.reason else ''} {v.figures}")
    return verdicts

"""The playbook's gates between two SGLang endpoints (`fleetspec gate`): a baseline and a candidate
reached by URL, for a rollout that something else performs (Kubernetes rolling a LeaderWorkerSet
group by group). No host, no ledger, no revert: a verdict and its figures, which the caller acts on.

The measuring and judging are ops/gates.py's and ops/bake.py's own (`gates.measure`, `gates.judge`,
`bake.judge`); only the link differs: `remote.http_direct.HttpDirect` instead of a host's SSH
channel. A baseline is measured now from its URL, or read from a file a previous run recorded
(`record`): the way to judge a single-group fleet against itself before and after the change.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fleetspec.errors import FleetspecError, RemoteError, UserError
from fleetspec.model import hostjson
from fleetspec.model.playbook import Gates, Playbook
from fleetspec.ops import bake, gates
from fleetspec.ops.gates import FAIL, INCONCLUSIVE, PASS, Measurement
from fleetspec.remote import prometheus, sglang_api
from fleetspec.remote.http_direct import HttpDirect

RECORD_KIND = "fleetspec-gate-baseline"
EXIT = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}


@dataclass(frozen=True)
class Settings:
    """How to measure: the playbook's gates, with the throughput levels the caller gave."""

    playbook: Playbook
    concurrency: tuple[int, ...] = ()          # replaces the throughput gate's levels when given
    hybrid: bool = False                       # the parity gate's hybrid tolerance applies
    api_key: str | None = None
    bake: bool = False

    def resolved(self) -> Gates:
        """The playbook's gates at the given levels, else at its own (with its serving_concurrency)."""
        g = self.playbook.gates
        if self.concurrency and g.throughput:
            return dataclasses.replace(g, throughput=dataclasses.replace(g.throughput, concurrency=self.concurrency))
        return gates.at_serving(g, None)[0]


@dataclass
class Report:
    verdict: str
    reasons: list[str]
    gates: list[gates.Verdict] = field(default_factory=list)
    baseline: dict = field(default_factory=dict)
    candidate: dict = field(default_factory=dict)
    bake: dict | None = None

    @property
    def exit_code(self) -> int:
        return EXIT[self.verdict]

    def to_json(self, s: Settings) -> dict:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "reasons": self.reasons,
                "algo": s.playbook.algo, "playbook": str(s.playbook.path),
                "expected_algorithm": s.playbook.speculative_algorithm,
                "gates": [{"name": v.name, "verdict": v.verdict, "reason": v.reason, "dry_run": v.dry_run,
                           "blocks": v.blocks, "figures": v.figures} for v in self.gates],
                "baseline": self.baseline, "candidate": self.candidate, "bake": self.bake}


def measure(client: HttpDirect, s: Settings) -> Measurement:
    """gates.measure over the URL, the way the playbook's gates ask."""
    g = s.resolved()
    return gates.measure(client, client.port, max_new_tokens=g.parity.max_new_tokens if g.parity else 32,
                         concurrency=tuple(g.throughput.concurrency) if g.throughput else (),
                         requests=g.throughput.requests if g.throughput else 0, api_key=s.api_key)


def served(client: HttpDirect, api_key: str | None) -> tuple[str | None, str | None]:
    """(the speculative algorithm /server_info names, None) or (None, why it could not be read)."""
    try:
        r = client.http("GET", client.port, "/server_info", timeout=10, headers=sglang_api.auth_headers(api_key))
        if r.status != 200:
            return None, f"{client.url}/server_info answered HTTP {r.status}"
        return str(hostjson.loads_object(r.body, "/server_info").get("speculative_algorithm")), None
    except (RemoteError, ValueError) as err:
        return None, str(err)


def to_record(url: str, m: Measurement) -> dict:
    return {"kind": RECORD_KIND, "version": 1, "url": url, "measurement": dataclasses.asdict(m)}


def from_record(path: Path) -> Measurement:
    """A baseline `record` wrote; UserError naming the file and what is wrong with it."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("kind") != RECORD_KIND:
            raise ValueError(f"expected a JSON object with kind {RECORD_KIND!r} (written by gate --record)")
        m = data["measurement"]
        return Measurement(outputs={str(k): list(v) for k, v in m["outputs"].items()}, texts=dict(m["texts"]),
                           accept_lengths=[float(x) for x in m["accept_lengths"]],
                           tokens_per_s={int(k): float(v) for k, v in m["tokens_per_s"].items()},
                           tpot_ms={int(k): float(v) for k, v in m["tpot_ms"].items()},
                           errors=list(m["errors"]), prompt_errors=list(m["prompt_errors"]), asked=m["asked"])
    except OSError as err:
        raise UserError(f"{path}: cannot read the recorded baseline: {err.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"{path}: not a recorded baseline: {err}") from None


def record(client: HttpDirect, s: Settings) -> tuple[int, dict, dict | None]:
    """(exit code, what to print, the record to write or None): a baseline that does not answer, or
    answers any request with an error, is not recorded (exit 3): a partial baseline judges nothing."""
    why = _unreachable(client, s.api_key)
    if why:
        return EXIT[INCONCLUSIVE], {"verdict": INCONCLUSIVE, "reasons": [f"baseline not answering: {why}"]}, None
    m = measure(client, s)
    if m.errors:
        return EXIT[INCONCLUSIVE], {"verdict": INCONCLUSIVE, "figures": m.figures(),
                                    "reasons": [f"{len(m.errors)} of the baseline's requests failed or came back "
                                                f"malformed (first: {m.errors[0]})"]}, None
    return 0, {"figures": m.figures()}, to_record(client.url, m)


def _unreachable(client: HttpDirect, api_key: str | None) -> str | None:
    try:
        r = client.http("GET", client.port, "/health", timeout=10, headers=sglang_api.auth_headers(api_key))
    except FleetspecError as err:
        return str(err)
    return None if r.status == 200 else f"{client.url}/health answered HTTP {r.status}"


def run(s: Settings, baseline: HttpDirect | Measurement, candidate: HttpDirect, *,
        note: Callable[[str], None] = lambda line: None, sleep: Callable[[float], None] = time.sleep) -> Report:
    """Measure both sides (the baseline first), judge with the playbook's gates, then bake."""
    sides = [("candidate", candidate)] + ([("baseline", baseline)] if isinstance(baseline, HttpDirect) else [])
    down = [f"{name} not answering: {why}" for name, c in sides if (why := _unreachable(c, s.api_key))]
    base_info = {"url": baseline.url} if isinstance(baseline, HttpDirect) else {"recorded": True}
    if down:
        return Report(INCONCLUSIVE, down, baseline=base_info, candidate={"url": candidate.url})
    if isinstance(baseline, HttpDirect):
        note(f"measuring the baseline {baseline.url}")
        before = measure(baseline, s)
    else:
        before = baseline
    note(f"measuring the candidate {candidate.url}")
    after = measure(candidate, s)
    algorithm, why = served(candidate, s.api_key)
    verdicts = gates.judge(s.resolved(), before, after, hybrid=s.hybrid)
    reasons = [f"{v.name}: {v.verdict}: {v.reason}" for v in verdicts if v.blocks]
    expected = s.playbook.speculative_algorithm
    if algorithm is not None and algorithm.upper() != expected.upper():
        verdicts.append(gates.Verdict("algorithm", FAIL, f"the candidate serves {algorithm}, expected {expected}",
                                      {"speculative_algorithm": algorithm}))
        reasons.append(verdicts[-1].reason)
    report = Report(PASS, reasons, verdicts, {**base_info, "figures": before.figures()},
                    {"url": candidate.url, "figures": after.figures(), "speculative_algorithm": algorithm,
                     **({"server_info_error": why} if why else {})})
    if s.bake and isinstance(baseline, HttpDirect):
        report.bake = _bake(s, baseline, candidate, note, sleep)
        if report.bake["outcome"] != PASS:
            reasons.extend(f"bake: {report.bake['outcome']}: {r}" for r in report.bake["reasons"])
    outcomes = [v.verdict for v in verdicts if v.blocks] + ([report.bake["outcome"]] if report.bake else [])
    report.verdict = FAIL if FAIL in outcomes else INCONCLUSIVE if INCONCLUSIVE in outcomes else PASS
    return report


def _bake(s: Settings, baseline: HttpDirect, candidate: HttpDirect, note, sleep) -> dict:
    """The playbook's bake over one window in which both sides serve: each side's /metrics at the
    start and the end, judged by ops/bake.judge (the candidate against the baseline)."""
    spec = s.playbook.bake
    assert spec is not None                     # the CLI refuses --bake without one
    scrape = {"baseline": _scraper(baseline, s.api_key), "candidate": _scraper(candidate, s.api_key)}
    first = {name: read() for name, read in scrape.items()}
    missing = [name for name, text in first.items() if text is None]
    if missing:
        return {"outcome": INCONCLUSIVE, "reasons": [f"the {' and '.join(missing)}'s /metrics does not answer "
                                                     f"(is --enable-metrics set?)"]}
    began = time.monotonic()
    while (left := spec.duration - (time.monotonic() - began)) > 0:
        note(f"bake {time.monotonic() - began:.0f}/{spec.duration:.0f}s")
        sleep(min(spec.interval, left))
    last = {name: read() for name, read in scrape.items()}
    if None in last.values():
        return {"outcome": FAIL if last["candidate"] is None else INCONCLUSIVE,
                "reasons": [f"the {name}'s /metrics stopped answering" for name, t in last.items() if t is None]}
    v = bake.judge(spec, prometheus.figures(first["baseline"] or "", last["baseline"] or ""),
                   prometheus.figures(first["candidate"] or "", last["candidate"] or ""))
    return {"outcome": v.outcome, "reasons": list(v.reasons), "baseline": v.baseline, "candidate": v.release,
            "seconds": spec.duration}


def _scraper(client: HttpDirect, api_key: str | None) -> Callable[[], str | None]:
    """The endpoint's /metrics text; None when it does not answer 200 (bake.scraper's rule, by URL)."""

    def read() -> str | None:
        try:
            r = client.http("GET", client.port, "/metrics", timeout=10, headers=sglang_api.auth_headers(api_key))
        except FleetspecError:
            return None
        return r.body.decode("utf-8", "replace") if r.status == 200 else None
    return read

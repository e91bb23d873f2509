"""`fleetspec history HOST [RELEASE]`: the host's ledger read back as releases and their steps.

The ledger is a flat list of step and status lines; an operator asks release-shaped questions
(what ran, did it stick, where did it fail, what did the gates measure). This folds the lines
into one summary per release and one story per release; the CLI only lays them out.
Torn lines are skipped and counted (model.ledger.parse).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from fleetspec.errors import RemoteError, UserError
from fleetspec.model import ledger as L
from fleetspec.model.layout import local_mirror
from fleetspec.model.rollout import is_rollout_id
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.redaction import redact_options
from fleetspec.remote.api import TransportLike


@dataclass
class LedgerRead:
    parsed: L.ParsedLedger
    source: str                 # "host" or the mirror file read instead
    warning: str | None = None


def read_ledger(t: TransportLike, host, root: Path | None = None) -> LedgerRead:
    """The host's ledger and its archive; when the host cannot be reached, the local mirror (said so).
    Secret options' values in lines an older version wrote unredacted are hidden here."""
    try:
        return LedgerRead(_redacted(HostState(t, host.name, host.vars.service).ledger_with_archive()), "host")
    except RemoteError as err:
        local = local_mirror(root, host, host.vars.service) / "ledger.jsonl" if root is not None else None
        if local is None or not local.is_file():
            raise
        return LedgerRead(_redacted(L.parse(local.read_text(errors="replace"))), str(local),
                          f"{host.name} did not answer ({err}); showing the local mirror {local}")


def _redacted(parsed: L.ParsedLedger) -> L.ParsedLedger:
    lines = [e.to_line() for e in parsed.entries]
    hidden = [redact_options(line) for line in lines]
    if hidden == lines:
        return parsed
    return dataclasses.replace(parsed, entries=L.parse("".join(line + "\n" for line in hidden)).entries)


@dataclass
class Step:
    name: str
    state: str                  # ok | failed | started (never finished) | skipped
    started: float | None
    ended: float | None
    seconds: float | None
    detail: dict = field(default_factory=dict)


@dataclass
class Release:
    id: str
    algo: str
    status: str
    started: float
    ended: float
    by: str
    steps: list[Step] = field(default_factory=list)
    statuses: list[L.Entry] = field(default_factory=list)
    failed_step: str | None = None
    reason: str | None = None
    figures: dict = field(default_factory=dict)      # gate name -> figures
    events: list[str] = field(default_factory=list)  # what happened to it later (`fleetspec rollback`)
    rollout: str | None = None  # the rollout that made it (its first line's detail; None in older ledgers)

    @property
    def seconds(self) -> float:
        return max(0.0, self.ended - self.started)

    @property
    def evidence(self) -> dict:
        for s in self.steps:
            if s.state == "failed" and s.name == self.failed_step:
                return s.detail.get("evidence") or {}
        return {}

    @property
    def container(self) -> dict:
        """A container unit's runtime, image and digest as preflight recorded them ({}: a bare unit)."""
        for s in self.steps:
            if s.name == "preflight" and isinstance(s.detail.get("container"), dict):
                return dict(s.detail["container"])
        return {}

    def to_json(self) -> dict:
        return {"release": self.id, "algo": self.algo, "status": self.status, "started": self.started,
                "seconds": round(self.seconds, 3), "failed_step": self.failed_step, "reason": self.reason,
                "figures": self.figures, "headline": headline(self.figures), "events": self.events,
                "rollout": self.rollout,
                **({"container": self.container} if self.container else {})}


def container_line(r: Release) -> str | None:
    """history's line for a release on a container unit: the image it ran and the label it carried."""
    c = r.container
    if not c:
        return None
    return (f"container: {c.get('runtime')} {c.get('image')} ({c.get('digest') or 'no digest'}), "
            f"label fleetspec.release={r.id}")


def algo_of(release_id: str) -> str:
    """Release ids are `<UTC stamp>-<algo>-<4 hex>` (model.release.new_release_id)."""
    parts = release_id.split("-")
    return "-".join(parts[1:-1]) if len(parts) >= 3 else "?"


def releases(parsed: L.ParsedLedger) -> list[Release]:
    """One Release per id in order of first appearance (the `baseline` pseudo-release and the
    router's drain lines left out)."""
    out: dict[str, Release] = {}
    open_steps: dict[tuple[str, str], L.Entry] = {}
    for e in parsed.entries:
        if e.release == "baseline" or e.kind == L.ROUTER:
            continue
        r = out.get(e.release)
        if r is None:
            r = out[e.release] = Release(e.release, algo_of(e.release), L.STARTED, e.ts, e.ts, e.by)
        r.ended = max(r.ended, e.ts)
        if r.rollout is None and is_rollout_id(e.detail.get("rollout")):
            r.rollout = e.detail["rollout"]
        if e.kind == "status":
            _status_change(r, e)
        elif e.state == "started":
            open_steps[(e.release, e.name)] = e
            r.steps.append(Step(e.name, "started", e.ts, None, None, dict(e.detail)))
        else:
            _step_end(r, e, open_steps.pop((e.release, e.name), None))
    return list(out.values())


def _status_change(r: Release, e: L.Entry) -> None:
    r.status = e.state
    r.statuses.append(e)
    if e.state == L.FAILED:
        r.failed_step = e.detail.get("step", r.failed_step)
        r.reason = e.detail.get("reason", r.reason)


def _step_end(r: Release, e: L.Entry, began: L.Entry | None) -> None:
    """A step's end line: closes its open step (or adds one never seen starting), takes its
    seconds, the gates' figures, a rollback as a later event, and the first failure as the reason."""
    step = next((s for s in reversed(r.steps) if s.name == e.name and s.state == "started"), None)
    if step is None:
        step = Step(e.name, e.state, None, None, None)
        r.steps.append(step)
    step.state, step.ended = e.state, e.ts
    detail = dict(e.detail)
    recorded = detail.pop("seconds", None)
    step.detail.update(detail)
    step.seconds = (float(recorded) if isinstance(recorded, (int, float))
                    else round(e.ts - began.ts, 3) if began is not None else None)
    if detail.get("skipped") is True and e.state == "ok":
        step.state = "skipped"
    figures = detail.get("figures") if e.name in ("gates", "bake") else None
    if e.state == "failed" and e.name in ("gates", "bake"):
        figures = (detail.get("evidence") or {}).get("figures")
    if isinstance(figures, dict):
        r.figures.update(figures)
    if e.name == "rollback" and e.state in ("ok", "failed"):
        by = detail.get("rollout")
        r.events.append(f"rollback to {detail.get('to') or step.detail.get('to') or '?'}"
                        + (" failed" if e.state == "failed" else "")
                        + (f" (rollout {by})" if is_rollout_id(by) and by != r.rollout else ""))
    elif e.state == "failed" and r.failed_step is None:
        r.failed_step, r.reason = e.name, detail.get("reason")


def of_rollout(parsed: L.ParsedLedger, rollout: str) -> list[Release]:
    """The releases and steps one rollout wrote on a host (its lines only: `rollouts show`)."""
    mine = tuple(e for e in parsed.entries if e.detail.get("rollout") == rollout)
    return releases(dataclasses.replace(parsed, entries=mine, numbers=()))


def find(parsed: L.ParsedLedger, host_name: str, wanted: str) -> Release:
    """A release by id, or by a unique prefix or suffix of its id (what fits in a terminal)."""
    rels = releases(parsed)
    exact = [r for r in rels if r.id == wanted]
    if exact:
        return exact[0]
    hits = [r for r in rels if r.id.startswith(wanted) or r.id.endswith(wanted)]
    if len(hits) == 1:
        return hits[0]
    known = ", ".join(r.id for r in rels[-5:]) or "none"
    if hits:
        raise UserError(f"{host_name}: release {wanted!r} is ambiguous ({', '.join(r.id for r in hits)})")
    raise UserError(f"{host_name}: no release {wanted!r} in the ledger (latest: {known})")


def headline(figures: dict) -> list[str]:
    """The gate figures an operator reads first, each with its unit, as separate phrases."""
    out = []
    acc = figures.get("acceptance") or {}
    if isinstance(acc.get("accept_length"), (int, float)):
        base = acc.get("baseline_accept_length")
        out.append(f"accept {acc['accept_length']:g} tok/step"
                   + (f" (baseline {base:g})" if isinstance(base, (int, float)) else ""))
    tput = figures.get("throughput") or {}
    levels = sorted({k.rsplit("_c", 1)[1] for k in tput if k.startswith("tok_s_c")}, key=lambda x: int(x) if x.isdigit() else 0)
    for c in levels:
        value, ratio = tput.get(f"tok_s_c{c}"), tput.get(f"ratio_c{c}")
        if isinstance(value, (int, float)):
            out.append(f"c{c} {value:g} tok/s" + (f" (x{ratio:.2f} of baseline)" if isinstance(ratio, (int, float)) else ""))
    bake = figures.get("bake") or {}
    if bake.get("outcome"):
        p99, base = bake.get("release_p99_s"), bake.get("baseline_p99_s")
        out.append(f"bake {bake['outcome']}: {bake.get('release_requests') or 0:g} requests, error rate "
                   + (f"{bake['release_error_rate']:.3f}" if isinstance(bake.get("release_error_rate"), (int, float))
                      else "-")
                   + (f", p99 {p99:.3f}s" if isinstance(p99, (int, float)) else "")
                   + (f" (baseline {base:.3f}s)" if isinstance(base, (int, float)) else ""))
    par = figures.get("parity") or {}
    if "prompts_compared" in par:
        diff = par.get("first_difference")
        out.append(f"parity {par['prompts_compared']} prompts"
                   + (f", differs at token {diff.get('token_index')}" if isinstance(diff, dict) else " identical"))
    return out

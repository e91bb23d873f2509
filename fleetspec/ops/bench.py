"""`fleetspec bench HOST --algo A --algo B`: the gates' measurement, on demand, per algo.

Each algo is deployed in turn (probes, no gates), measured with the same prompts and load, and the
host is put back where it was at the end (the baseline, or the release it was on), so operators
can tune DDTree budgets per host and see tokens/s and acceptance side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetspec.errors import DeployFailed, FleetspecError
from fleetspec.model import ledger as L
from fleetspec.model.layout import local_mirror
from fleetspec.model.playbook import load_playbook_for
from fleetspec.ops import gates
from fleetspec.ops.deploy import DeployRequest, deploy
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.rollback import rollback


@dataclass
class BenchRow:
    host: str
    algo: str
    options: dict
    served: str | None = None
    accept_length: float | None = None
    figures: dict = field(default_factory=dict)
    error: str = ""


def bench_host(t, host, root, runs: list[tuple[str, dict]], *, concurrency=(1, 4), requests=16,
               max_new_tokens=64, echo=print, progress=lambda _: None) -> list[BenchRow]:
    state = HostState(t, host.name, host.vars.service, mirror=local_mirror(root, host, host.vars.service))
    start_on = state.current()
    rows, made = [], []
    try:
        for algo, options in runs:
            playbook = load_playbook_for(root, algo)
            row = BenchRow(host.name, algo, options)
            req = DeployRequest(host=host, playbook=playbook, root=root, options=options, run_gates=False, prune=False)
            outcome = deploy(t, req, echo=echo, progress=progress)
            if outcome.release:
                made.append(outcome.release)
            if outcome.status != "healthy":
                row.error = f"{outcome.status}: {outcome.reason}"
                rows.append(row)
                continue
            m = gates.measure(t, host.vars.api_port, max_new_tokens=max_new_tokens, concurrency=tuple(concurrency),
                              requests=requests, api_key=host.vars.api_key.value() if host.vars.api_key else None)
            row.served = playbook.speculative_algorithm
            row.figures = m.figures()
            row.accept_length = row.figures.get("accept_length")
            rows.append(row)
            echo(f"[{host.name}] {algo} {options or ''}: {row.figures}")
    finally:
        try:
            rollback(t, host, root, start_on, echo=echo, progress=progress)
        except FleetspecError as err:
            raise DeployFailed(f"{host.name}: benchmark done but returning to {start_on or 'baseline'} failed: {err}") from err
        for rid in made:   # benchmark releases are not rollback targets
            if state.ledger().releases().get(rid) == L.HEALTHY:
                state.record(L.Entry.status(rid, L.SUPERSEDED, reason="benchmark run"))
    return rows

"""Taking one host's worker out of the router and putting it back.

The removal is in the host's ledger before the router is asked (`record`), so a controller killed
while the worker is out leaves a `drained` line: `status` shows it and the next deploy or rollback
puts the worker back (`put_back_pending`). A worker goes back only once the router lists it
healthy; min_serving is checked before anything changes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from fleetspec.errors import UserError
from fleetspec.model.ledger import DRAINED, RESTORED, Entry, ParsedLedger, router_entry
from fleetspec.model.router import RouterSpec
from fleetspec.remote.router import RouterClient

Record = Callable[[Entry], None]
InFlight = Callable[[], "int | None"]


@dataclass(frozen=True)
class Drained:
    worker: str
    was_listed: bool
    waited_s: float = 0.0
    left: int | None = None          # requests the engine still held when the wait ended


def check_min_serving(spec: RouterSpec, client: RouterClient, taking_out: list[str]) -> None:
    """Refuse (one line, exit 2) a batch that would leave fewer than min_serving healthy workers."""
    out = {u.rstrip("/") for u in taking_out}
    healthy = [w.url for w in client.workers() if w.healthy]
    left = [u for u in healthy if u not in out]
    if len(left) < spec.min_serving:
        raise UserError(f"router {spec.name}: taking out {len(out & set(healthy))} of {len(healthy)} healthy "
                        f"worker(s) would leave {len(left)} serving, fewer than min_serving {spec.min_serving} "
                        f"(use a smaller --serial or add workers)")


def drain(spec: RouterSpec, client: RouterClient, worker: str, record: Record, in_flight: InFlight,
          poll_s: float = 0.2) -> Drained:
    """Out of the router, then wait (at most spec.drain_timeout) until the engine holds no request."""
    if client.find(worker) is None:
        return Drained(worker, was_listed=False)
    record(router_entry(DRAINED, spec.name, worker))
    client.remove(worker, wait=spec.add_timeout)
    began = time.monotonic()
    left = in_flight()
    while left and time.monotonic() - began < spec.drain_timeout:
        time.sleep(poll_s)
        left = in_flight()
    return Drained(worker, True, round(time.monotonic() - began, 3), left)


def put_back(spec: RouterSpec, client: RouterClient, worker: str, record: Record) -> None:
    """Back into the router; done once the router lists it healthy, then recorded as restored."""
    client.add(worker, wait=spec.add_timeout, healthy=True)
    record(router_entry(RESTORED, spec.name, worker))


def put_back_pending(parsed: ParsedLedger, routers: dict[str, RouterSpec],
                     client_for: Callable[[RouterSpec], RouterClient], record: Record) -> str | None:
    """A worker a cut-off command left drained goes back; returns its URL, or None."""
    entry = parsed.drained()
    if entry is None:
        return None
    spec = routers.get(str(entry.detail.get("router")))
    if spec is None:
        raise UserError(f"the ledger says worker {entry.detail.get('worker')} was taken out of router "
                        f"{entry.detail.get('router')!r}, which the inventory no longer names")
    worker = str(entry.detail["worker"])
    put_back(spec, client_for(spec), worker, record)
    return worker

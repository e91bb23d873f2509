"""Taking one host's worker out of the router and putting it back.

The removal is in the host's ledger before the router is asked (`record`), so a controller killed
while the worker is out leaves a `drained` line: `status` shows it and the next deploy or rollback
puts the worker back (`put_back_pending`). A worker goes back only once the router lists it
healthy; min_serving is checked before anything changes."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from fleetspec.errors import FleetspecError, UserError
from fleetspec.model.ledger import DRAINED, RESTORED, Entry, ParsedLedger, router_entry
from fleetspec.model.ledger import parse as parse_ledger
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


@dataclass(frozen=True)
class Seat:
    """A host's place in a router: the router, its worker URL there, and every router the
    inventory names (a removal a cut-off command left may name another one)."""
    spec: RouterSpec
    worker: str
    routers: Mapping[str, RouterSpec]


def seats(inv, hosts) -> dict[str, Seat]:
    """{host name: Seat} for the hosts that join a router (the var `router`)."""
    out = {}
    for h in hosts:
        spec = inv.router_of(h)
        if spec is not None:
            out[h.name] = Seat(spec, spec.worker_for(h.name, h.address, h.vars.api_port), inv.routers)
    return out


def client_for(spec: RouterSpec) -> RouterClient:
    key = None
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise UserError(f"router {spec.name}: api_key.secret_env names ${spec.api_key_env}, which is not set")
    return RouterClient(spec.admin_url, key, name=f"router {spec.name}")


def check_batches(batches: list[list], seat_of: Mapping[str, Seat], client=client_for) -> None:
    """Every batch, before anything changes: refused in one line (exit 2) when taking its
    workers out would leave a router fewer than min_serving healthy workers."""
    by_router: dict[str, tuple[RouterSpec, list[list[str]]]] = {}
    for batch in batches:
        per: dict[str, list[str]] = {}
        for h in batch:
            s = seat_of.get(h.name)
            if s is not None:
                per.setdefault(s.spec.name, []).append(s.worker)
                by_router.setdefault(s.spec.name, (s.spec, []))
        for name, workers in per.items():
            by_router[name][1].append(workers)
    for spec, groups in by_router.values():
        c = client(spec)
        for workers in groups:
            check_min_serving(spec, c, workers)


def engine_in_flight(t, host) -> InFlight:
    """Requests the host's engine holds, from its own /metrics through the host's link (None
    when it exports no such gauge: sglang without --enable-metrics)."""
    from fleetspec.remote import prometheus
    from fleetspec.remote.sglang_api import auth_headers

    key = host.vars.api_key.value() if host.vars.api_key else None

    def read() -> int | None:
        try:
            r = t.http("GET", host.vars.api_port, "/metrics", timeout=5, headers=auth_headers(key))
        except FleetspecError:
            return None
        if r.status != 200:
            return None
        return prometheus.in_flight(r.body.decode("utf-8", "replace"))
    return read


class HostDrain:
    """One host's time out of its router during a deploy or a rollback: a removal left by a
    cut-off command goes back first, the worker leaves before the engine restarts, and it is
    back when the command ends, whatever happened (`ensure_back`)."""

    def __init__(self, seat: Seat, record: Record, in_flight: InFlight, echo: Callable[[str], None], host: str,
                 client=client_for):
        self.seat, self.record, self.in_flight, self.echo, self.host = seat, record, in_flight, echo, host
        self.client = client(seat.spec)
        self._client_for = client
        self.drained: Drained | None = None
        self.out_since: float | None = None
        self.out_s = 0.0

    def restore_pending(self, ledger_text: str) -> None:
        back = put_back_pending(parse_ledger(ledger_text), dict(self.seat.routers), self._client_for, self.record)
        if back:
            self.echo(f"[{self.host}] put {back} back into its router (a cut-off command had left it out)")

    def take_out(self) -> None:
        self.out_since = time.monotonic()
        self.drained = drain(self.seat.spec, self.client, self.seat.worker, self.record, self.in_flight)
        d = self.drained
        if d.was_listed:
            left = f", {d.left} request(s) still held after drain_timeout" if d.left else ""
            self.echo(f"[{self.host}] out of router {self.seat.spec.name}; in-flight requests done in "
                      f"{d.waited_s:.1f}s{left}")
        else:
            self.echo(f"[{self.host}] router {self.seat.spec.name} does not list {self.seat.worker}: nothing to drain")

    @property
    def out(self) -> bool:
        return self.drained is not None and self.drained.was_listed

    def put_back(self, healthy: bool = True) -> None:
        if not self.out:
            return
        if healthy:
            put_back(self.seat.spec, self.client, self.seat.worker, self.record)
        else:   # an engine that is not healthy is listed anyway: the router's own checks keep traffic off it
            self.client.add(self.seat.worker, wait=self.seat.spec.add_timeout, healthy=False)
            self.record(router_entry(RESTORED, self.seat.spec.name, self.seat.worker, healthy=False))
        self.drained = None
        if self.out_since is not None:
            self.out_s = round(time.monotonic() - self.out_since, 2)
        self.echo(f"[{self.host}] back in router {self.seat.spec.name} after {self.out_s:.1f}s")

    def ensure_back(self) -> str | None:
        """The last word (a finally): a worker still out goes back; returns a note when it could not."""
        if not self.out:
            return None
        try:
            self.put_back(healthy=False)
            return None
        except FleetspecError as err:
            note = (f"{self.seat.worker} is still out of router {self.seat.spec.name} ({err}); the next deploy or "
                    f"rollback of {self.host} puts it back")
            self.echo(f"[{self.host}] {note}")
            return note

    def summary(self) -> dict:
        d = self.drained
        return {"router": self.seat.spec.name, "worker": self.seat.worker, "out_s": self.out_s,
                **({"drain_waited_s": d.waited_s, "left": d.left} if d else {})}

"""Taking one host's worker out of the router and putting it back.

The removal is in the host's ledger before the router is asked (`record`), so a controller killed
while the worker is out leaves a `drained` line: `status` shows it and the next deploy or rollback
puts the worker back (`put_back_pending`). Root on the host can write any line there, so a line
only ever puts back this host's own worker in its own router, as the inventory names them; a line
naming another router or URL is reported and ignored. A worker goes back only once the router
lists it healthy; min_serving is checked before anything changes."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from fleetspec.errors import FleetspecError, UserError
from fleetspec.model.ledger import DRAINED, RESTORED, ROUTER, Entry, ParsedLedger, router_entry
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


def check_min_serving(spec: RouterSpec, client: RouterClient, taking_out: list[str], at_once: int | None = None) -> None:
    """Refuse (one line, exit 2) when the worst `at_once` of `taking_out` (default: all of them)
    out together would leave fewer than min_serving healthy workers. The worst are the ones the
    router lists healthy now: a worker it already counts unhealthy serves nothing, and its host
    fails fast, so the pool's next host takes its place."""
    out = {u.rstrip("/") for u in taking_out}
    healthy = {w.url for w in client.workers() if w.healthy}
    could = len(out & healthy) if at_once is None else min(at_once, len(out & healthy))
    left = len(healthy) - could
    if left < spec.min_serving:
        raise UserError(f"router {spec.name}: taking out {could} of {len(healthy)} healthy worker(s) at once would "
                        f"leave {left} serving, fewer than min_serving {spec.min_serving} "
                        f"(use a smaller --serial or --parallel, or add workers)")


_GUARDS: dict[str, threading.Lock] = {}
_GUARDS_LOCK = threading.Lock()


def _guard(spec: RouterSpec) -> threading.Lock:
    """One lock per router address in this process: a batch's drains check min_serving and leave
    one at a time, so each check sees the workers the others already took out."""
    with _GUARDS_LOCK:
        return _GUARDS.setdefault(spec.admin_url, threading.Lock())


def _count(in_flight: InFlight) -> int | None:
    """The engine's in-flight count, or None (unknown) whatever reading it met: by now the worker
    is out of its router, and an exception here would leave it out (the revert never runs)."""
    try:
        left = in_flight()
    except Exception:  # a host's /metrics must not decide whether the worker goes back
        return None
    return left if isinstance(left, int) and not isinstance(left, bool) and left >= 0 else None


def drain(spec: RouterSpec, client: RouterClient, worker: str, record: Record, in_flight: InFlight,
          poll_s: float = 0.2) -> Drained:
    """Out of the router, then wait (at most spec.drain_timeout) until the engine holds no request
    (an in-flight count that cannot be read is unknown: the wait ends, left None). min_serving
    is checked again right before, on what the router says now (UserError: nothing changed)."""
    with _guard(spec):
        if client.find(worker) is None:
            return Drained(worker, was_listed=False)
        check_min_serving(spec, client, [worker])
        record(router_entry(DRAINED, spec.name, worker))
        client.remove(worker, wait=spec.add_timeout)
    began = time.monotonic()
    left = _count(in_flight)
    while left and time.monotonic() - began < spec.drain_timeout:
        time.sleep(poll_s)
        left = _count(in_flight)
    return Drained(worker, True, round(time.monotonic() - began, 3), left)


def put_back(spec: RouterSpec, client: RouterClient, worker: str, record: Record) -> None:
    """Back into the router; done once the router lists it healthy, then recorded as restored."""
    client.add(worker, wait=spec.add_timeout, healthy=True)
    record(router_entry(RESTORED, spec.name, worker))


@dataclass(frozen=True)
class Pending:
    """What a host's ledger says is still out of a router: `own` when this host's own worker in
    its own router (as the inventory says) was left drained; `ignored`, one short description per
    router line since it was last put back that names anything else."""
    own: bool
    ignored: tuple[str, ...] = ()


def _pair(entry: Entry) -> tuple[str, str] | None:
    d = entry.detail
    if not isinstance(d, dict):
        return None
    return str(d.get("router")), str(d.get("worker")).rstrip("/")


def pending(parsed: ParsedLedger, seat: "Seat") -> Pending:
    """Read the ledger's router lines as data, never as orders: root on a host can append any
    line, so a line names at most which of this host's own workers to put back. Lines after the
    host's worker was last put back that name another router, another URL, or have no object as
    their detail are only reported."""
    own = (seat.spec.name, seat.worker.rstrip("/"))
    lines = [e for e in parsed.entries if e.kind == ROUTER]
    last_back = max((i for i, e in enumerate(lines) if _pair(e) == own and e.state == RESTORED), default=-1)
    out, ignored = False, []
    for e in lines[last_back + 1:]:
        pair = _pair(e)
        if pair == own:
            out = e.state == DRAINED
        elif e.state == DRAINED or pair is None:
            what = (f"router {pair[0][:60]!r}, worker {pair[1][:120]!r}" if pair is not None
                    else f"a detail that is not an object ({type(e.detail).__name__})")
            ignored.append(what)
    return Pending(out, tuple(ignored))


def put_back_pending(parsed: ParsedLedger, seat: "Seat", client: RouterClient, record: Record) -> Pending:
    """This host's worker, left drained by a cut-off command, goes back into this host's router
    (both as the inventory names them); any other pending line is returned, not acted on."""
    found = pending(parsed, seat)
    if found.own:
        put_back(seat.spec, client, seat.worker, record)
    return found


@dataclass(frozen=True)
class Seat:
    """A host's place in a router, as the inventory names it: the router and its worker URL there."""
    spec: RouterSpec
    worker: str


def seats(inv, hosts) -> dict[str, Seat]:
    """{host name: Seat} for the hosts that join a router (the var `router`)."""
    out = {}
    for h in hosts:
        spec = inv.router_of(h)
        if spec is not None:
            out[h.name] = Seat(spec, spec.worker_for(h.name, h.address, h.vars.api_port))
    return out


def client_for(spec: RouterSpec) -> RouterClient:
    key = None
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise UserError(f"router {spec.name}: api_key.secret_env names ${spec.api_key_env}, which is not set")
    return RouterClient(spec.admin_url, key, name=f"router {spec.name}")


def check_batches(batches: list[list], seat_of: Mapping[str, Seat], client=client_for, parallel: int = 0) -> None:
    """Every batch, before anything changes: refused in one line (exit 2) when the worst set of
    its hosts that can be out at once (`parallel` of them, default the whole batch) would leave a
    router fewer than min_serving healthy workers. Each drain checks again (`drain`)."""
    by_router: dict[str, tuple[RouterSpec, list[tuple[list[str], int]]]] = {}
    for batch in batches:
        per: dict[str, list[str]] = {}
        for h in batch:
            s = seat_of.get(h.name)
            if s is not None:
                per.setdefault(s.spec.name, []).append(s.worker)
                by_router.setdefault(s.spec.name, (s.spec, []))
        width = min(len(batch), parallel or len(batch))
        for name, workers in per.items():
            by_router[name][1].append((workers, width))
    for spec, groups in by_router.values():
        c = client(spec)
        for workers, width in groups:
            check_min_serving(spec, c, workers, at_once=width)


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
        return prometheus.in_flight(r.body.decode("utf-8", "replace"))      # never raises: None when unknown
    return read


class HostDrain:
    """One host's time out of its router during a deploy or a rollback: a removal left by a
    cut-off command goes back first, the worker leaves before the engine restarts, and it is
    back when the command ends, whatever happened (`ensure_back`)."""

    def __init__(self, seat: Seat, record: Record, in_flight: InFlight, echo: Callable[[str], None], host: str,
                 client=client_for):
        self.seat, self.record, self.in_flight, self.echo, self.host = seat, record, in_flight, echo, host
        self.client = client(seat.spec)
        self.drained: Drained | None = None
        self.out_since: float | None = None
        self.out_s = 0.0

    def restore_pending(self, ledger_text: str) -> None:
        found = put_back_pending(parse_ledger(ledger_text), self.seat, self.client, self.record)
        if found.own:
            self.echo(f"[{self.host}] put {self.seat.worker} back into its router {self.seat.spec.name} "
                      f"(a cut-off command had left it out)")
        if found.ignored:
            self.echo(f"[{self.host}] ignored {len(found.ignored)} router line(s) in its ledger that do not name "
                      f"its own worker {self.seat.worker} in router {self.seat.spec.name} "
                      f"({'; '.join(found.ignored[:3])}{'; …' if len(found.ignored) > 3 else ''}): nothing was "
                      f"sent for them; a host's ledger only ever puts back its own worker")

    def take_out(self) -> None:
        """Out of the router. Once the `drained` line is written the worker counts as out, even
        when asking the router fails after it: `ensure_back` then still puts it back."""
        self.out_since = time.monotonic()
        written: list[Entry] = []

        def record(entry: Entry) -> None:
            self.record(entry)
            written.append(entry)
        try:
            self.drained = drain(self.seat.spec, self.client, self.seat.worker, record, self.in_flight)
        except BaseException:
            if written:
                self.drained = Drained(self.seat.worker, True)
            raise
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
        except Exception as err:  # the last word says what is left out, whatever it met
            note = (f"{self.seat.worker} is still out of router {self.seat.spec.name} ({err}); the next deploy or "
                    f"rollback of {self.host} puts it back")
            self.echo(f"[{self.host}] {note}")
            return note

    def summary(self) -> dict:
        d = self.drained
        return {"router": self.seat.spec.name, "worker": self.seat.worker, "out_s": self.out_s,
                **({"drain_waited_s": d.waited_s, "left": d.left} if d else {})}

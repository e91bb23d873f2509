"""`fleetspec status`: one row per host, gathered in parallel, one SSH round trip of facts each.

A host that cannot be reached is a row saying so (within its connect timeout), never a crash:
status is what an operator runs when something is already wrong.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any, Iterable

from fleetspec.errors import FleetspecError
from fleetspec.model import container_launch, gpuhealth
from fleetspec.model.inventory import Host
from fleetspec.ops import container_plan
from fleetspec.ops.argv import speculative_algorithm_from_argv
from fleetspec.remote import facts
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import (
    gpu_health,
    listener,
    release_state,
    server_info,
    sglang,
    systemd,
    unit_age,
    unit_files,
)

DEFAULT_WORKERS = 16
DEFAULT_READY_TIMEOUT = 900.0   # seconds a model may take to load (probes' default; extra.ready_timeout)

# What `health` says, and what an operator does about it:
OK = "ok"                # /health answers 200
LOADING = "loading"      # the unit is starting or running, the port does not answer yet, within the ready timeout: wait
DOWN = "down"            # the unit failed or is inactive, or it still does not answer past the ready timeout: look at it
UNHEALTHY = "unhealthy"  # the port answers but /health is not 200: look at the engine
STARTING_STATES = ("active", "activating", "reloading")


@dataclass
class HostStatus:
    host: str
    address: str
    service: str
    reachable: bool = False
    error: str | None = None
    state: str | None = None            # ActiveState/SubState, e.g. active/running
    algo: str | None = None             # as the operator wrote it (NEXTN), else as served
    served_algo: str | None = None      # what /server_info resolved (EAGLE for NEXTN)
    sglang: str | None = None
    release: str | None = None
    release_status: str | None = None
    drift: str | None = None            # pristine | N files differ | managed by fleetspec …
    drift_files: list[str] = field(default_factory=list)
    unit_drift: list[str] = field(default_factory=list)   # unit/drop-ins changed by hand since the baseline
    health: str | None = None           # ok | loading | down | unhealthy (see the constants above)
    gpu: str | None = None              # ok | "-" (no nvidia-smi) | ? (not read) | the GPU problems in a few words
    http: str | None = None             # what /health said: 200, 503, refused, timeout …
    up_s: float | None = None           # seconds since the unit last (re)started
    ready_timeout: float | None = None
    notes: list[str] = field(default_factory=list)
    container: dict[str, Any] | None = None   # a docker/podman run unit: runtime, image, digest, state, restarts
    drained: dict[str, Any] | None = None     # {router, worker}: out of its router (ops/drain.py)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _short_error(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text.splitlines()[0][:300]


def host_status(transport, host: Host) -> HostStatus:
    """Everything status shows for one host; errors become fields, never exceptions."""
    start = time.monotonic()
    row = HostStatus(host=host.name, address=f"{host.address}:{host.port}", service=host.vars.service)
    try:
        _fill(row, transport, host)
    except FleetspecError as err:
        row.error = _short_error(err)
    except Exception as err:  # one broken host must not hide the others
        row.error = f"{type(err).__name__}: {_short_error(err)}"
    row.seconds = round(time.monotonic() - start, 3)
    return row


def _fill(row: HostStatus, t: TransportLike, host: Host) -> None:
    got = facts.gather_many(t, {
        "unit": (systemd, {"service": host.vars.service}),
        "sglang": (sglang, {"python": host.vars.python}),
        "state": (release_state, {"service": host.vars.service}),
        "files": (unit_files, {"service": host.vars.service}),
        "age": (unit_age, {"service": host.vars.service}),
        "gpu": (gpu_health, {"service": host.vars.service}),
        "listener": (listener, {"service": host.vars.service, "port": host.vars.api_port}),
    }, timeout=min(host.command_timeout, 120), errors="return")
    row.reachable = True
    unit, state = got["unit"], got["state"]
    age = got["age"]
    if not isinstance(age, FleetspecError) and age.available:
        row.up_s = age.seconds
    declared = _fill_unit(row, unit)
    _fill_sglang(row, got["sglang"])
    _fill_gpu(row, host, got["gpu"])
    state = _fill_state(row, state, host)
    if not isinstance(unit, FleetspecError) and unit.load_state == "loaded":
        row.notes.extend(_dropin_notes(host, unit.dropin_paths))
        if state is not None and state.baseline:
            _fill_unit_drift(row, t, host, got["files"])
        if unit.argv and container_launch.runtime_of(unit.exec_start[0].path) and not isinstance(got["files"], FleetspecError):
            row.container = container_plan.container_status(t, got["files"], host.vars.service)
            if row.container:
                row.notes.append(container_plan.status_line(row.container))
    _probe_http(row, t, host, declared, None if isinstance(unit, FleetspecError) else unit, got["listener"])


def _fill_unit(row: HostStatus, unit) -> str | None:
    """The service's state from systemd; returns the speculative algorithm its ExecStart declares."""
    if isinstance(unit, FleetspecError):
        row.state = "unknown"
        row.notes.append(_short_error(unit))
        return None
    if not unit.available:
        row.state = "no systemd"
        return None
    row.state = unit.active_state if unit.load_state == "loaded" else unit.load_state
    if unit.load_state == "loaded" and unit.sub_state and unit.sub_state != unit.active_state:
        row.state = f"{unit.active_state}/{unit.sub_state}"
    return speculative_algorithm_from_argv(unit.argv) if unit.argv else None


def _fill_gpu(row: HostStatus, host: Host, health) -> None:
    """The GPU problems preflight would refuse on (those it can see without the launch: not the
    GPU count nor the driver), whether waived for deploys or not: status shows the host as it is."""
    if isinstance(health, FleetspecError):
        row.gpu = "?"
        row.notes.append(f"{host.name}: GPU health not read: {_short_error(health)}")
        return
    if not health.present:
        row.gpu = "-"
        return
    found = gpuhealth.problems(health, None, None, host.vars.service)
    row.gpu = gpuhealth.column(found)
    row.notes.extend(f"{host.name}: {p.line}" for p in found)


def _fill_sglang(row: HostStatus, sg) -> None:
    if isinstance(sg, FleetspecError):
        row.sglang, row.drift = "?", "unknown"
        row.notes.append(_short_error(sg))
    elif not sg.installed:
        row.sglang, row.drift = "not installed", "-"
    else:
        row.sglang = sg.version
        row.drift_files = [*sg.drift, *sg.missing]


def _fill_state(row: HostStatus, state, host: Host):
    """fleetspec's own state: release, lock, an interrupted deploy; returns the state (None if unread)."""
    if isinstance(state, FleetspecError):
        row.notes.append(_short_error(state))
        state = None
    if state is not None and state.current:
        row.release, row.release_status = state.current, state.release_status
    lock_note = None
    if state is not None and state.locked:
        lock_note = "a deploy or rollback holds the lock now"
        stale = _stale_holder(state.holder)
        if stale is not None:   # its process is gone: the story it left unfinished is shown too
            lock_note = f"stale lock: {stale.describe()} is no longer running; the next deploy or rollback ends it"
            state = dataclasses.replace(state, locked=False)
    if state is not None and state.interrupted:
        row.notes.append(f"{state.interrupted}; finish it with: fleetspec rollback {host.name}" if state.needs_rollback
                         else state.interrupted)
    if state is not None and state.staged_ahead:
        row.notes.append(f"release {state.prestaged} is staged ahead, not switched (host unchanged; its smoke tests "
                         f"passed): fleetspec deploy {host.name} --algo {state.staged_ahead} switches to it")
    elif state is not None and state.prestaged:
        row.notes.append(f"release {state.prestaged} is prestaged, not switched (host unchanged): this host's "
                         "deploy in the rollout uses it; if the rollout stopped, its next deploy marks it failed")
    if state is not None:
        _fill_router(row, state, host)
    if lock_note:
        row.notes.append(lock_note)
    if row.drift is None:
        n = len(row.drift_files)
        if state is not None and state.current:
            row.drift = "managed by fleetspec" + (f", {n} files differ" if n else "")
        else:
            row.drift = f"{n} files differ" if n else "pristine"
    return state


def _fill_router(row: HostStatus, state, host: Host) -> None:
    """A host baking (a deploy watching its release now) or drained (out of its router)."""
    last = state.last_entry or {}
    if state.locked and last.get("name") == "bake" and last.get("state") == "started":
        row.notes.append(f"baking: release {last.get('release')} is watched on the engine's metrics "
                         "(a regression reverts it)")
    if state.drained:
        row.drained = state.drained
        row.notes.append(f"drained: {state.drained.get('worker')} is out of router {state.drained.get('router')}"
                         + ("" if state.locked else f"; the next deploy or rollback of {host.name} puts it back"))


def _fill_unit_drift(row: HostStatus, t: TransportLike, host: Host, files) -> None:
    try:
        row.unit_drift = _unit_drift(t, host, files)
    except FleetspecError as err:       # e.g. a corrupt baseline: said, and the row goes on
        row.notes.append(_short_error(err))
    if row.unit_drift:
        row.drift = f"unit edited by hand; {row.drift}"
        row.notes.append(f"{host.name}: {'; '.join(row.unit_drift)} since the baseline; review it, then run: "
                         f"fleetspec baseline {host.name} --retake")


def _dropin_notes(host: Host, paths: list[str]) -> list[str]:
    """fleetspec's drop-in under its pre-rename name (still in force; the next deploy or rollback
    renames it), and admin drop-ins systemd applies after fleetspec's (their ExecStart= would win)."""
    from fleetspec.ops.hoststate import LEGACY_DROPIN_NAMES, sorts_after_ours

    out = []
    for path in paths:
        if PurePosixPath(path).name in LEGACY_DROPIN_NAMES:
            out.append(f"{host.name}: fleetspec's drop-in has its old name {path}; the next deploy or rollback "
                       f"renames it")
        elif sorts_after_ours(path):
            out.append(f"{host.name}: the admin drop-in {path} sorts after fleetspec's; a deploy is refused "
                       f"until it is renamed")
    return out


def _unit_drift(t: TransportLike, host: Host, files: unit_files.UnitFiles | FleetspecError) -> list[str]:
    """The unit file and the operator's drop-ins against the recorded baseline (fleetspec's own
    drop-in left out): what preflight would refuse."""
    from fleetspec.ops.hoststate import HostState, is_ours

    if isinstance(files, FleetspecError):      # the fact failed: said as a note by the caller
        raise files

    baseline = HostState(t, host.name, host.vars.service).baseline_from_text(files.baseline_json, repair=False)
    if baseline is None or files.unit_bytes is None:
        return []
    dropins = {p: b for p, b in files.dropins.items() if not is_ours(p)}
    key = host.vars.api_key           # the inventory's secret: named, and its value, never shown
    return baseline.differences(files.unit_bytes, dropins, [key.env] if key else [],
                                [v for v in [key.value() if key else None] if v])


def _stale_holder(raw):
    from fleetspec.remote.lock_holder import Holder

    try:
        holder = Holder(**raw) if isinstance(raw, dict) and "unparsed" not in raw else None
    except TypeError:
        return None
    return holder if holder is not None and holder.dead_here() else None


def ready_timeout(host: Host) -> float:
    value = host.vars.extra.get("ready_timeout", DEFAULT_READY_TIMEOUT)
    return float(value) if isinstance(value, (int, float)) and value > 0 else DEFAULT_READY_TIMEOUT


def classify(http: str, active_state: str | None, sub_state: str | None, up_s: float | None,
             timeout: float, n_restarts: int | None = 0) -> tuple[str, str | None]:
    """Pure: (health, note) from what /health said and what systemd says about the unit.
    NRestarts counts systemd's own restarts since the last start by hand (a manual start
    resets it): a unit that is starting again after crashing is down, not loading."""
    if http == "200":
        return OK, None
    if http.isdigit():
        return UNHEALTHY, f"/health answers HTTP {http}"
    if sub_state == "auto-restart":                 # it crashed and systemd is about to try again
        return DOWN, f"unit {active_state}/{sub_state}: it exited and systemd restarts it"
    if active_state in STARTING_STATES and n_restarts:
        return DOWN, (f"crash loop: systemd restarted it {n_restarts} time{'s' if n_restarts > 1 else ''} "
                      f"since it was last started by hand")
    if active_state in STARTING_STATES:
        if up_s is not None and up_s > timeout:
            return DOWN, f"port not answering {up_s:.0f}s after start, past the ready timeout ({timeout:.0f}s)"
        since = f"started {up_s:.0f}s ago, " if up_s is not None else ""
        return LOADING, f"port not answering yet ({since}ready timeout {timeout:.0f}s)"
    if active_state is None:
        return DOWN, None
    return DOWN, f"unit {active_state}{'/' + sub_state if sub_state else ''}"


def health_http(t: TransportLike, port: int) -> tuple[str, str | None]:
    """What /health said (its status code, refused, timeout or error) and, for an error, why."""
    try:
        return str(t.http("GET", port, "/health", timeout=5).status), None
    except FleetspecError as err:
        text = str(err)
        if "refused" in text:
            return "refused", None
        if "within" in text or "timed out" in text:
            return "timeout", None
        return "error", _short_error(err)


def _probe_http(row: HostStatus, t, host: Host, declared: str | None, unit=None, owner=None) -> None:
    port = host.vars.api_port
    row.ready_timeout = ready_timeout(host)
    row.http, error = health_http(t, port)
    if error:
        row.notes.append(error)
    active = unit.active_state if unit is not None and getattr(unit, "found", False) else None
    sub = unit.sub_state if active else None
    restarts = unit.n_restarts if active else None
    row.health, note = classify(row.http, active, sub, row.up_s, row.ready_timeout, restarts)
    foreign = _foreign_listener(row, owner)
    if foreign:                       # a local user's server on the port: its answers are not the service's
        row.health, note = UNHEALTHY, foreign
    if note and row.health != OK:
        row.notes.append(f"{host.name}: {row.health}: {note}")
    launch_algo = None
    if row.http.isdigit() and not foreign:
        api_key = host.vars.api_key.value() if host.vars.api_key else None
        try:
            info = server_info.fetch(t, port, api_key=api_key, timeout=5)
            row.served_algo = info.speculative_algorithm
            if info.launch_command:
                launch_algo = speculative_algorithm_from_argv(info.launch_command)
        except FleetspecError as err:
            row.notes.append(_short_error(err))
    # What the server was launched with wins (it is what runs); then the unit's ExecStart.
    row.algo = launch_algo or declared or row.served_algo
    if row.algo is None and (row.served_algo is not None or row.state not in (None, "unknown", "no systemd")):
        row.algo = "none"


def _foreign_listener(row: HostStatus, owner) -> str | None:
    """Why what answered on the port is not the service (facts/listener.py), when it answered."""
    if not (row.http or "").isdigit():
        return None
    if isinstance(owner, FleetspecError):
        row.notes.append(_short_error(owner))
        return None
    if owner is None or not owner.checked:
        if owner is not None and owner.missing == "ss":      # no systemd: status says so already
            row.notes.append(f"{row.host}: {owner.reason()}")
        return None
    return owner.reason() if owner.foreign() or owner.sockets_without_pid else None


def fleet_status(pool, hosts: Iterable[Host], workers: int = DEFAULT_WORKERS) -> list[HostStatus]:
    """Rows in inventory order; hosts are queried concurrently (at most `workers` at a time)."""
    hosts = list(hosts)
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(hosts))), thread_name_prefix="status") as ex:
        return list(ex.map(lambda h: host_status(pool.get(h), h), hosts))


@dataclass
class WatchResult:
    rows: list[HostStatus]
    all_ok: bool
    seconds: float
    rounds: int

    @property
    def exit_code(self) -> int:
        """0 every host ok; 4 the deadline passed with hosts still loading (and none worse);
        1 the deadline passed with a host down, unhealthy or unreachable."""
        if self.all_ok:
            return 0
        bad = [r for r in self.rows if r.health != OK]
        return 4 if bad and all(r.reachable and r.health == LOADING for r in bad) else 1


def watch(pool, hosts: Iterable[Host], deadline_s: float, interval: float = 2.0, workers: int = DEFAULT_WORKERS,
          on_round=lambda rows, elapsed: None, clock=time.monotonic, sleep=time.sleep) -> WatchResult:
    """Status again and again until every host is ok or `deadline_s` has passed."""
    hosts = list(hosts)
    start = clock()
    rounds = 0
    while True:
        rows = fleet_status(pool, hosts, workers=workers)
        rounds += 1
        elapsed = clock() - start
        on_round(rows, elapsed)
        if all(r.reachable and r.health == OK for r in rows):
            return WatchResult(rows, True, elapsed, rounds)
        if elapsed + interval > deadline_s:
            return WatchResult(rows, False, elapsed, rounds)
        sleep(interval)

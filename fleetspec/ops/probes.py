"""Probing a service after a restart until it proves it serves the expected algorithm.

`systemctl restart` returns 0 even for a unit that crashes, so readiness is decided only by what
the service answers: /ready, /health, /server_info (the resolved algorithm) and a real greedy
/generate. /v1/models answers before warm-up and is never used. While waiting, the unit's state
is streamed by one host-side loop, so a unit whose process exits fails the probe at once. Once
/ready answers, the answers count only if every listener on the port is one of the unit's own
processes (remote/facts/listener.py): a local user who bound the port first is not the service.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from fleetspec.errors import RemoteError
from fleetspec.model import hostjson
from fleetspec.remote import facts, sglang_api, systemd
from fleetspec.remote.facts import listener


@dataclass
class ProbeResult:
    ok: bool
    stage: str                  # the last stage reached: unit, ready, health, server_info, generate
    reason: str = ""
    waited_s: float = 0.0
    evidence: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeSpec:
    port: int
    expected_algorithm: str | None      # resolved name, e.g. DDTREE, EAGLE, DFLASH; None: don't check
    ready_timeout: float = 900.0
    interval: float = 0.5
    prompt: str = "The capital of France is"
    max_new_tokens: int = 16
    api_key: str | None = None


def spec_for_host(host, expected: str | None, playbook_probes=None) -> ProbeSpec:
    """Probe settings for a host: the playbook's, with the host's own model-load deadline."""
    p = playbook_probes
    timeout = float(host.vars.extra.get("ready_timeout", p.ready_timeout if p else 900.0))
    key = host.vars.api_key.value() if host.vars.api_key else None
    kwargs = {}
    if p is not None:
        kwargs = dict(interval=p.interval, prompt=p.generate.prompt, max_new_tokens=p.generate.max_new_tokens)
    return ProbeSpec(port=host.vars.api_port, expected_algorithm=expected, ready_timeout=timeout,
                     api_key=key, **kwargs)


POLL_CAP_S = 1.0   # the longest pause between looks: a crash or readiness is seen within it


def wait_healthy(t, service: str, spec: ProbeSpec, *, since: systemd.Restarted | None = None,
                 progress: Callable[[str], None] = lambda _: None, clock=time.monotonic,
                 stream: systemd.UnitStream | None = None, restart: bool = False) -> ProbeResult:
    """Poll /ready until the service generates with the expected algorithm, its process exits (a
    failure at once: no waiting out a restart loop), or the deadline. The unit's state comes from
    one host-side watch (systemd.UnitStream) read between the polls; where it cannot run or has
    ended, from one `systemctl show` per look. `stream`: one restart_watched opened (closed
    here); `restart`: open one that restarts the unit first (its state before is `since`)."""
    if stream is None and restart:
        stream, since = restart_watched(t, service, spec)
    elif stream is None:
        stream = _open(t, service, spec, None)
    try:
        return _wait(t, service, spec, since, progress, clock, stream)
    finally:
        stream.close()


def restart_watched(t, service: str, spec: ProbeSpec) -> tuple[systemd.UnitStream, systemd.Restarted]:
    """One command restarts the unit and watches it come up: it prints the state before (returned
    once read), restarts, then streams. The deferred ledger lines ride in front as its prelude, so
    they are durable before the restart."""
    stream = _open(t, service, spec, systemd.restart_command(service))
    try:
        return stream, stream.before()
    except BaseException:
        stream.close()
        raise


def _open(t, service: str, spec: ProbeSpec, restart: str | None) -> systemd.UnitStream:
    take = getattr(t, "take_prelude", None)
    return systemd.UnitStream(t, service, spec.ready_timeout + 5, prelude=take() if take else None, restart=restart)


def _wait(t, service, spec, since, progress, clock, stream) -> ProbeResult:
    start = clock()
    delay = spec.interval
    while True:
        waited = clock() - start
        unit = stream.latest(wait=2.0) or systemd.look(t, service)
        if systemd.exited(unit, since):
            return ProbeResult(False, "unit", f"{service} exited: {unit.describe()}", waited,
                               {"unit": unit.active_state, "result": unit.result, "exit_status": unit.main_status})
        if not systemd.started_since(unit, since):
            last = "the restart has not replaced the old process yet"
        else:
            ready = _get(t, spec, "/ready")
            if ready is not None and ready[0] == 200:
                foreign = listener_problem(t, service, spec.port)
                if foreign:
                    return ProbeResult(False, "listener", foreign, waited, {"port": spec.port})
                return _after_ready(t, spec, waited)
            last = f"/ready {ready[0]}" if ready else "/ready: connection refused"
        progress(f"waiting for {service}: {unit.active_state}/{unit.sub_state}, {last}, "
                 f"{waited:.0f}s of {spec.ready_timeout:.0f}s")
        if waited >= spec.ready_timeout:
            return ProbeResult(False, "ready", f"not ready after {spec.ready_timeout:.0f}s ({last})", waited)
        pause = min(delay, max(0.0, spec.ready_timeout - waited))
        if stream.ended:
            time.sleep(pause)
        else:                          # a unit exit, or the new process starting, ends it at once
            replaced = systemd.started_since(unit, since)
            stream.watch(pause, lambda u, replaced=replaced: systemd.exited(u, since) or
                         (not replaced and systemd.started_since(u, since)))
        delay = min(delay * 1.5, max(spec.interval, POLL_CAP_S))


def listener_problem(t, service: str, port: int) -> str | None:
    """Why what answers on `port` is not `service` (remote/facts/listener.py), or None: the unit's
    cgroup and the listeners' pids in one command, once /ready answered."""
    try:
        owner = facts.gather(t, listener, service=service, port=port, timeout=30)
    except RemoteError as err:
        return f"cannot tell who listens on port {port}: {err}"
    return owner.reason() or None


def _get(t, spec: ProbeSpec, path: str):
    try:
        r = t.http("GET", spec.port, path, timeout=10, headers=sglang_api.auth_headers(spec.api_key))
        return r.status, r.body
    except RemoteError:
        return None


def _after_ready(t, spec: ProbeSpec, waited: float) -> ProbeResult:
    health = _get(t, spec, "/health")
    if health is None or health[0] != 200:
        return ProbeResult(False, "health", f"/health answered {health[0] if health else 'nothing'}", waited,
                           {"health": health[0] if health else None})
    info = _get(t, spec, "/server_info")
    if info is None or info[0] != 200:
        return ProbeResult(False, "server_info", f"/server_info answered {info[0] if info else 'nothing'}", waited)
    try:
        served = hostjson.loads_object(info[1], "/server_info").get("speculative_algorithm")
    except ValueError as err:
        return ProbeResult(False, "server_info", str(err), waited)
    if spec.expected_algorithm and str(served).upper() != spec.expected_algorithm.upper():
        return ProbeResult(False, "server_info", f"serves {served}, expected {spec.expected_algorithm}", waited,
                           {"speculative_algorithm": served})
    gen = generate(t, spec, spec.prompt, spec.max_new_tokens)
    if not gen.get("text") or not gen.get("ok"):
        return ProbeResult(False, "generate", f"greedy /generate failed: {gen.get('error') or 'empty text'}",
                           waited, {"generate": gen})
    return ProbeResult(True, "generate", "", waited, {"speculative_algorithm": served, "generate": gen})


def generate(t, spec: ProbeSpec, prompt: str, max_new_tokens: int, temperature: float = 0.0) -> dict:
    """The probe's view of one /generate: ok or the error, never an exception."""
    try:
        data = sglang_api.generate(t, spec.port, prompt, max_new_tokens, api_key=spec.api_key,
                                   temperature=temperature)
    except (RemoteError, ValueError) as err:
        return {"ok": False, "error": str(err)}
    if not isinstance(data, dict) or not isinstance(data.get("meta_info", {}), dict):
        return {"ok": False, "error": "/generate answered a JSON value that is not an object with a meta_info object"}
    meta = data.get("meta_info", {})
    return {"ok": True, "text": data.get("text", ""), "output_ids": data.get("output_ids"),
            "accept_length": meta.get("spec_accept_length"), "verify_ct": meta.get("spec_verify_ct"),
            "completion_tokens": meta.get("completion_tokens"), "latency": meta.get("e2e_latency")}

"""Before a deploy: the engine the host runs now must serve, or be loading and then serve.

A deploy measures the running engine for its gates' baseline, and on failure reverts onto it and
proves it healthy, so it starts only from an engine that answers. A host met right after a boot
or a restart (the first minute of a fresh lab, a host an operator just restarted) is still
loading its model: the deploy waits for it, within what is left of the host's ready timeout, with
the restart wait's own progress line, and measures only then. A host whose engine is down,
unhealthy or past its timeout is refused before anything is locked or written (exit 2), saying
what to do. Deploying onto such a host anyway, to replace a broken engine, is the operator's
explicit choice (`--allow-unhealthy`), and only without gates: there is no baseline to measure.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from fleetspec.errors import UserError
from fleetspec.model.inventory import Host
from fleetspec.model.layout import HostLayout
from fleetspec.ops import probes, status
from fleetspec.remote import lock as lock_mod
from fleetspec.remote import systemd
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts.systemd import SystemdUnit
from fleetspec.remote.facts.unit_age import UnitAge


def health_now(t: TransportLike, host: Host, unit: SystemdUnit, age: UnitAge | None,
               timeout: float) -> tuple[str, str | None]:
    """(health, note) as `status` says it: one /health request beside what systemd said."""
    up_s = age.seconds if age is not None and age.available else None
    active = unit.active_state if unit.found else None
    http, _ = status.health_http(t, host.vars.api_port)
    return status.classify(http, active, unit.sub_state if active else None, up_s, timeout,
                           unit.n_restarts if active else None)


def require_serving(t: TransportLike, host: Host, unit: SystemdUnit, age: UnitAge | None, spec: probes.ProbeSpec,
                    *, allow_unhealthy: bool = False, wait: bool = True,
                    progress: Callable[[str | None], None] = lambda _: None) -> str | None:
    """None when the engine serves now; a note when it was waited for or is let through; else a
    one-line UserError naming the state and what to run. `wait=False` (a plan, a staging ahead:
    nothing measured, nothing live changed) notes a loading engine instead of waiting for it.
    An engine that a live deploy or rollback is restarting is that holder's: the refusal is the
    lock's (naming the holder), never a wait or a "down"."""
    service = host.vars.service
    health, note = health_now(t, host, unit, age, spec.ready_timeout)
    if health == status.OK:
        return None
    held = lock_mod.busy(t, str(HostLayout(service).lock))
    if held is not None:
        raise held
    if allow_unhealthy:
        return f"{host.name}: {service} is {health} ({note}); deploying onto it as asked (--allow-unhealthy)"
    look = (f"{systemd.on_host_command(host.address, systemd.status_command(service))}; "
            f"{systemd.on_host_command(host.address, systemd.journal_command(service))}")
    if health != status.LOADING:
        raise UserError(f"{host.name}: {service} is {health} ({note}); a deploy starts from a serving engine: "
                        f"look at it ({look}), or replace it with --allow-unhealthy --no-gates")
    if not wait:
        return f"{host.name}: {service} is still loading ({note}); a deploy waits for it"
    up_s = age.seconds if age is not None and age.available and age.seconds is not None else 0.0
    left = max(1.0, spec.ready_timeout - up_s)
    result = probes.wait_healthy(t, service, dataclasses.replace(spec, ready_timeout=left, expected_algorithm=None),
                                 progress=lambda line: progress(f"[{host.name}] {line}"))
    progress(None)
    if not result.ok:
        raise UserError(f"{host.name}: {service} was loading and did not come to serve within its ready timeout "
                        f"({spec.ready_timeout:.0f}s): {result.reason}; look at it ({look})")
    return f"{host.name}: {service} was still loading; waited {result.waited_s:.0f}s for it to serve"

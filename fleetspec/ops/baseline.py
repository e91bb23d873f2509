"""`fleetspec baseline HOST --retake`: the one way a baseline is replaced, on purpose.

The baseline is the service as fleetspec first found it (`take_baseline`, recorded by a deploy's
baseline step). A deploy never overwrites it; when the operator changed the service by hand,
preflight refuses and names this command. Retaking is refused while a fleetspec release is active,
since the live ExecStart would then be fleetspec's, not the operator's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fleetspec import unit_context
from fleetspec.errors import FleetspecError, RemoteError, UserError
from fleetspec.model import container_launch, hostjson
from fleetspec.model import ledger as L
from fleetspec.model.baseline import Baseline, recorded_environment
from fleetspec.model.launch import LaunchRefused
from fleetspec.model.layout import local_mirror
from fleetspec.model.ledger import actor
from fleetspec.ops import argv as argv_ops
from fleetspec.ops import container_plan
from fleetspec.ops.argv import LaunchPlan
from fleetspec.ops.execstart import exec_command
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.preflight_checks import gather_unit, read_unit_files
from fleetspec.ops.redaction import secret_refs
from fleetspec.remote import facts, files
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import container_inspect
from fleetspec.remote.facts import sglang as sglang_fact
from fleetspec.remote.lock import RemoteLock

if TYPE_CHECKING:
    from fleetspec.ops.preflight_result import Preflight
    from fleetspec.remote.facts.sglang import SglangInstall


def retake(t: TransportLike, host, root) -> str:
    state = HostState(t, host.name, host.vars.service, mirror=local_mirror(root, host, host.vars.service))
    with RemoteLock(t, str(state.layout.lock), release="baseline-retake"):
        current = state.current()
        if current:
            raise UserError(f"{host.name}: release {current} is active; run fleetspec rollback {host.name} first")
        unit = gather_unit(t, host.vars.service)
        unit_bytes, dropins, texts = read_unit_files(t, unit)
        view = _View(host, unit, unit_bytes, dropins, list(exec_command(t, unit_bytes, texts, host.vars.service).argv),
                     facts.gather(t, sglang_fact, python=host.vars.python))
        view.container_facts = _container_facts(t, host, view.exec_argv)
        try:
            old = state.read_baseline()
        except FleetspecError:        # a corrupt one with no verified copy: retaking is the way out
            old = None
        new = take_baseline(t, view)
        state.write_baseline(new, replace=True)
        state.record(L.Entry.step("baseline", "retake", "ok", old_unit_sha256=old.unit_sha256 if old else None,
                                  new_unit_sha256=new.unit_sha256))
    changed = old.differences(new.unit_bytes, new.dropins, *secret_refs(host)) if old else []
    return (f"{host.name}: baseline retaken ({new.declared_algorithm or 'no speculative algorithm'}, unit sha256 "
            f"{new.unit_sha256[:12]})" + (f"; since the old one: {'; '.join(changed)}" if changed else ""))


def _container_facts(t: TransportLike, host, argv: list[str]) -> dict | None:
    """A `docker run`/`podman run` unit's runtime, image id and digest, as a deploy's preflight
    records them (None for any other unit); a refusal there is a refusal here."""
    if not argv or container_launch.runtime_of(argv[0]) is None:
        return None
    where = f"{host.name}: {host.vars.service}"
    try:
        run = container_launch.parse_run(argv)
    except LaunchRefused as err:
        raise UserError(f"{where}: {err}") from None
    return container_plan.container_facts(where, run, facts.gather(t, container_inspect, runtime=run.path,
                                                                     image=run.image, container=None))


class _View:
    """The fields take_baseline reads, without a full preflight (no playbook is involved)."""

    def __init__(self, host, unit, unit_bytes, dropins, exec_argv, sglang: SglangInstall):
        self.host, self.unit, self.unit_bytes, self.dropins, self.exec_argv = host, unit, unit_bytes, dropins, exec_argv
        self.service, self.python = host.vars.service, host.vars.python
        self.sglang = sglang
        self.launch: LaunchPlan | None = None
        self.container_facts: dict | None = None


def take_baseline(t: TransportLike, pf: Preflight | _View) -> Baseline:
    """Record the service as found: unit bytes, drop-ins, ExecStart, Environment, sglang, served algo."""
    served = None
    try:
        r = t.http("GET", pf.host.vars.api_port, "/server_info", timeout=10)
        if r.status == 200:
            served = hostjson.loads_object(r.body, "/server_info").get("speculative_algorithm")
    except (RemoteError, ValueError):
        pass
    return Baseline(
        service=pf.service, unit_path=pf.unit.fragment_path or "", unit_bytes=pf.unit_bytes, dropins=pf.dropins,
        exec_argv=pf.exec_argv,
        environment=dict[str, str | None](recorded_environment(pf.unit_bytes, pf.dropins,
                                                              *secret_refs(pf.host, getattr(pf, "playbook", None)))),
        sglang={"version": pf.sglang.version, "site_packages": pf.sglang.site_packages,
                "python": pf.python, "drift": list(pf.sglang.drift)},
        served_algorithm=served,
        declared_algorithm=(pf.launch.derived.algorithm if pf.launch is not None
                            else argv_ops.speculative_algorithm_from_argv(pf.exec_argv)),
        taken_at=time.time(), taken_by=actor(), container=dict(getattr(pf, "container_facts", None) or {}),
        sources=generator_sources(t, pf.unit),
    )


def generator_sources(t: TransportLike, unit) -> dict[str, bytes]:
    """The files a generator made the unit from (a Quadlet `.container` and its own drop-ins,
    `NAME.container.d/*.conf`), which a rollback restores: the generated unit itself is written
    again by every daemon-reload."""
    if not unit_context.is_generated(unit.fragment_path) or not unit.source_path:
        return {}
    paths = [unit.source_path, *files.list_files(t, f"{unit.source_path}.d/*.conf")]
    return {p: t.get_bytes(p) for p in paths}

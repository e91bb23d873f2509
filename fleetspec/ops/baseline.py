"""`fleetspec baseline HOST --retake`: the one way a baseline is replaced, on purpose.

A deploy never overwrites the baseline; when the operator changed the service by hand,
preflight refuses and names this command. Retaking is refused while a fleetspec release is active,
since the live ExecStart would then be fleetspec's, not the operator's.
"""

from __future__ import annotations

from fleetspec.errors import FleetspecError, UserError
from fleetspec.model import ledger as L
from fleetspec.model.layout import local_mirror
from fleetspec.ops import preflight
from fleetspec.ops.hoststate import HostState
from fleetspec.remote.lock import RemoteLock


def retake(t, host, root) -> str:
    state = HostState(t, host.name, host.vars.service, mirror=local_mirror(root, host.name, host.vars.service))
    with RemoteLock(t, str(state.layout.lock), release="baseline-retake"):
        current = state.current()
        if current:
            raise UserError(f"{host.name}: release {current} is active; run fleetspec rollback {host.name} first")
        unit = preflight.gather_unit(t, host.vars.service)
        unit_bytes, dropins, texts = preflight.read_unit_files(t, unit)
        view = _View(host, unit, unit_bytes, dropins, preflight.effective_argv(unit_bytes, texts))
        from fleetspec.remote import facts
        from fleetspec.remote.facts import sglang as sglang_fact

        view.sglang = facts.gather(t, sglang_fact, python=host.vars.python)
        try:
            old = state.read_baseline()
        except FleetspecError:        # a corrupt one with no verified copy: retaking is the way out
            old = None
        new = preflight.take_baseline(t, view)
        state.write_baseline(new, replace=True)
        state.record(L.Entry.step("baseline", "retake", "ok", old_unit_sha256=old.unit_sha256 if old else None,
                                  new_unit_sha256=new.unit_sha256))
    changed = old.differences(new.unit_bytes, new.dropins, *preflight.secret_refs(host)) if old else []
    return (f"{host.name}: baseline retaken ({new.declared_algorithm or 'no speculative algorithm'}, unit sha256 "
            f"{new.unit_sha256[:12]})" + (f"; since the old one: {'; '.join(changed)}" if changed else ""))


class _View:
    """The fields take_baseline reads, without a full preflight (no playbook is involved)."""

    def __init__(self, host, unit, unit_bytes, dropins, exec_argv):
        self.host, self.unit, self.unit_bytes, self.dropins, self.exec_argv = host, unit, unit_bytes, dropins, exec_argv
        self.service, self.python = host.vars.service, host.vars.python
        self.sglang = None

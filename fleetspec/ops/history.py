"""`fleetspec history HOST`: the host's ledger, with torn lines skipped and counted."""

from __future__ import annotations

from fleetspec.ops.hoststate import HostState


def read_history(t, host):
    parsed = HostState(t, host.name, host.vars.service).ledger()
    return parsed.entries, parsed.skipped

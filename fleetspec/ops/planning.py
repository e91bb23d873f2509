"""What a deploy would do (`--plan`), and pruning old releases after a commit."""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetspec.model import ledger as L
from fleetspec.model.names import is_name
from fleetspec.model.release import BASELINE, Release
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.rendering import dropin_text
from fleetspec.ops.staging import sha
from fleetspec.remote import facts, files
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import file_text, link_target

if TYPE_CHECKING:
    from fleetspec.ops.preflight import Preflight


@dataclass
class Plan:
    """Everything a deploy would do on one host, secrets redacted; nothing on the host changed."""
    host: str
    service: str
    sglang: str
    algo: str
    expected_algorithm: str
    previous: str
    execstart_diff: str
    dropin: str
    notes: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)      # package path -> sha256
    kernels: dict[str, str] = field(default_factory=dict)    # file name -> sha256
    smoke: list[str] = field(default_factory=list)
    gates: list[str] = field(default_factory=list)
    launch: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plan(t: TransportLike, pf: Preflight, state: HostState) -> Plan:
    """Everything a deploy would do, computed without changing anything on the host."""
    old = pf.exec_argv
    new = pf.new_argv
    diff = list(difflib.unified_diff([a + "\n" for a in old], [a + "\n" for a in new],
                                     f"{pf.service} ExecStart (now)", f"{pf.service} ExecStart (after)", n=2))
    previous = state.current() or BASELINE
    fake = Release(id="<new>", host=pf.host.name, service=pf.service, algo=pf.playbook.algo, mode="release",
                   sglang_version=pf.sglang.version, argv=new, previous=previous,
                   exec_prefix=pf.exec_prefix, exec_path=pf.exec_path,
                   launch=pf.launch.to_dict() if pf.launch else {})
    return Plan(
        host=pf.host.name, service=pf.service, sglang=pf.sglang.version,
        algo=pf.playbook.algo, expected_algorithm=pf.playbook_algorithm,
        notes=list(pf.notes), options=dict(pf.options.values),
        execstart_diff=pf.redact("".join(diff)), dropin=pf.redact(dropin_text(pf, fake)),
        files={p: sha(b) for p, b in pf.patch_files().items()},
        kernels={n: sha(b) for n, b in pf.kernel_files().items()},
        smoke=[name for name, _, _ in pf.smoke_scripts(kernels_dir="<release>/kernels")],
        gates=pf.gate_names(), previous=previous,
        launch=json.loads(pf.redact(json.dumps(pf.launch.to_dict()))) if pf.launch else None,
    )


def prune(t: TransportLike, state: HostState, keep: int, protect=()) -> list[str]:
    """Remove healthy releases beyond the newest `keep` (never the current one, nor `protect`: the
    release a deploy came from, which `--rollback-all-on-abort` returns to). Failed releases
    do not count towards `keep`: the newest `keep` of them are kept for forensics, older ones go
    too (a host that failed often filled its disk with them). `current` and the ledger are read
    in one round trip."""
    link, text = facts.gather_many(state.io, [(link_target, {"path": str(state.layout.current)}),
                                              (file_text, {"path": str(state.layout.ledger)})], errors="raise")
    current = state.current(link)
    statuses = L.parse(text or "").releases()
    healthy = [r for r, s in statuses.items() if s == L.HEALTHY]
    failed = [r for r, s in statuses.items() if s in (L.FAILED, L.ROLLED_BACK)]
    old = [r for r in healthy[:-keep] + failed[:-keep] if r != current and r not in protect] if keep > 0 else []
    for rid in old:
        if not is_name(rid):    # the ledger parser drops such lines; a path part is checked where it is used too
            continue
        files.rm_tree(t, str(state.layout.release(rid)))
        state.record(L.Entry.status(rid, L.PRUNED))
    return old

"""What a deploy would do (`--plan`), and pruning old releases after a commit."""

from __future__ import annotations

import dataclasses
import difflib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetspec.model import ledger as L
from fleetspec.model.names import is_name
from fleetspec.model.release import BASELINE
from fleetspec.ops import gates, steps
from fleetspec.ops.hoststate import HostState
from fleetspec.ops.rendering import dropin_text
from fleetspec.ops.staging import new_release, sha
from fleetspec.remote import ledger_files
from fleetspec.remote.api import TransportLike
from fleetspec.remote.lock import RemoteLock

if TYPE_CHECKING:
    from fleetspec.ops.preflight_result import Preflight


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
    steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plan(t: TransportLike, pf: Preflight, state: HostState) -> Plan:
    """Everything a deploy would do, computed without changing anything on the host."""
    previous = state.current() or BASELINE
    fake = new_release(pf, "<new>", previous)
    old, new = pf.exec_argv, fake.argv          # a container unit's: the whole runtime argv
    diff = list(difflib.unified_diff([a + "\n" for a in old], [a + "\n" for a in new],
                                     f"{pf.service} ExecStart (now)", f"{pf.service} ExecStart (after)", n=2))
    return Plan(
        host=pf.host.name, service=pf.service, sglang=pf.sglang_version,
        algo=pf.playbook.algo, expected_algorithm=pf.playbook_algorithm,
        notes=[*pf.notes, *([pf.staged_ahead_note] if pf.staged_ahead_note else []),
               *filter(None, [gates.plan_note(pf)])], options=dict(pf.options.values),
        execstart_diff=pf.redact("".join(diff)), dropin=pf.redact(dropin_text(pf, fake)),
        files={p: sha(b) for p, b in pf.patch_files().items()},
        kernels={n: sha(b) for n, b in pf.kernel_files().items()},
        smoke=[name for name, _, _ in pf.smoke_scripts(kernels_dir="<release>/kernels")],
        gates=pf.gate_names(), previous=previous,
        launch=json.loads(pf.redact(json.dumps(pf.launch.to_dict()))),
        steps=steps.plan_lines(pf.playbook.smoke.when),
    )


def prune_candidates(statuses: dict[str, str], current: str | None, keep: int, protect=()) -> list[str]:
    """Healthy releases beyond the newest `keep` (never the current one, nor `protect`: the
    release a deploy came from, which `--rollback-all-on-abort` returns to). Finished releases
    that were not kept (failed, rolled back, or superseded: a benchmark's, a restaged one) do not
    count towards `keep`: the newest `keep` of them stay for forensics, older ones go too (a host
    that failed often filled its disk with them)."""
    healthy = [r for r, s in statuses.items() if s == L.HEALTHY]
    failed = [r for r, s in statuses.items() if s in (L.FAILED, L.ROLLED_BACK, L.SUPERSEDED)]
    old = [r for r in healthy[:-keep] + failed[:-keep] if r != current and r not in protect] if keep > 0 else []
    return [r for r in old if is_name(r)]   # the parser drops such lines; path parts are checked where used too


def prune_script(state: HostState, old: list[str]) -> tuple[str, dict[str, str]]:
    """ledger_files.prune_script for the releases in `old`, and each one's PRUNED ledger line (for
    pruned_by to mirror the ones done)."""
    lines = {rid: state.line(L.Entry.status(rid, L.PRUNED)) for rid in old}
    return ledger_files.prune_script(state.layout, lines), lines


def to_prune(state: HostState, read_text: str | None, current: str, keep: int, protect=()) -> list[str]:
    """prune_candidates from what a deploy knows, with no read: the ledger as read under the lock,
    plus the lines this state appended since and those still deferred; `current`: its release."""
    text = read_text or ""
    ours = [*state.written, *map(state.line, state.pending)]
    sep = "\n" if text and not text.endswith("\n") else ""
    statuses = L.parse(text + sep + "".join(line + "\n" for line in ours)).releases()
    return prune_candidates(statuses, current, keep, protect)


def rotation_script(state: HostState, read_text: str | None) -> tuple[str, str | None]:
    """Shell that moves the pruned releases' lines out of the ledger read under the lock (see
    model.ledger.rotation); ("", None) while it is small."""
    ranges = L.rotation(read_text or "")
    if not ranges:
        return "", None
    return ledger_files.rotation_script(state.layout, ranges, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))


def prune_and_unlock(t: TransportLike, state: HostState, lock: RemoteLock, old: list[str], note) -> list[str]:
    """One command (carrying the deferred lines): remove and record each release in `old`, rotate
    a ledger grown past ROTATE_AT_BYTES, then remove the lock's files, which go whatever the rest
    did. A release that could not be removed, or a rotation that did not happen, is only noted: a
    prune never fails a healthy deploy. Returns the releases pruned."""
    script, lines = prune_script(state, old)
    rotate, archive = rotation_script(state, lock.read_text)
    before = "; ".join(part for part in (script, rotate) if part)
    r = lock.remove_files(t, before=before, timeout=120 if before else 30)
    done = ledger_files.pruned_by(r.stdout, lines)
    state.appended([lines[rid] for rid in done])
    why = (r.stderr.strip().splitlines() or [f"exit {r.rc}"])[-1][:200]
    left = [rid for rid in lines if rid not in done]
    if left:
        note(f"[{state.host}] note: could not prune {', '.join(left)}: {why}")
    if archive and f"{ledger_files.ROTATED_MARK} " not in r.stdout:
        note(f"[{state.host}] note: could not move old lines out of {state.layout.ledger}: {why}")
    return done

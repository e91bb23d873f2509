"""Render a release's drop-in and rollback.sh from the templates, and lint the unit with them.

The drop-in is what systemd runs; rollback.sh is the operator's way back without fleetspec.
Both land in the release folder; nothing that runs changes here.
"""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fleetspec import render, systemd_unit
from fleetspec.errors import FleetspecError
from fleetspec.model import ledger as L
from fleetspec.model.baseline import sha256
from fleetspec.model.release import BASELINE, Release
from fleetspec.ops.hoststate import DROPIN_NAME, LEGACY_DROPIN_NAMES, HostState, dropin_path, legacy_dropin_paths
from fleetspec.ops.staging import SECRETS_FILE, sha
from fleetspec.remote import files, systemd
from fleetspec.remote.api import CommandResult, TransportLike

if TYPE_CHECKING:
    from fleetspec.ops.preflight_result import Preflight


@functools.lru_cache(maxsize=8)
def _env(root: Path):
    return render.environment(root)


_COMPILING = threading.Lock()


def _template(root: Path, name: str):
    """One environment per templates folder for the whole process: each template is compiled once,
    not once per host (jinja re-reads a template whose file changed). The lock: a fleet's hosts
    ask at the same moment, and each would otherwise compile its own copy."""
    with _COMPILING:
        return _env(root).get_template(name)


def dropin_text(pf: Preflight, release: Release) -> str:
    env_lines = [systemd_unit.environment_line(k, v) for k, v in pf.environment(release).items()]
    for name in (release.launch or {}).get("env_dropped", []):   # speculation-only, dropped by the playbook
        env_lines.append(f"UnsetEnvironment={name}")
    if pf.playbook.launch.secret_env:   # values never in the drop-in (0644): a file only root reads
        env_lines.append(f"EnvironmentFile={pf.layout.release(release.id)}/{SECRETS_FILE}")
    return _template(pf.root, "fleetspec-dropin.conf.j2").render(
        release=release, rendered_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        release_dir=str(pf.layout.release(release.id)), exec_line=systemd_unit.exec_line(release.argv, release.exec_prefix, release.exec_path),
        environment_lines=env_lines, guard=pf.guard, service_escaped=pf.service.removesuffix(".service"),
        stop_timeout=stop_timeout_for(pf),
    )


def context_length(argv: list[str]) -> int | None:
    """The launch's --context-length (None when it leaves it to the model's config)."""
    for i, word in enumerate(argv):
        value = word.split("=", 1)[1] if word.startswith("--context-length=") else (
            argv[i + 1] if word == "--context-length" and i + 1 < len(argv) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def stop_timeout_for(pf: Preflight) -> int:
    """TimeoutStopSec for the new launch: the playbook's stop.timeout, else derived from the
    longest generation its --context-length allows (model/bake.py's stop_timeout)."""
    from fleetspec.model.bake import stop_timeout

    return stop_timeout(pf.playbook.stop, context_length(list(pf.new_argv)))


def rollback_script(pf: Preflight, state: HostState, release: Release, previous_sha256: str) -> str:
    """`previous_sha256`: the drop-in live before the switch ("" when none: back to the baseline)."""
    baseline = pf.baseline
    if baseline is None:
        raise FleetspecError(f"{pf.host.name}: no baseline recorded before render")
    prev = release.previous
    prev_dir = str(state.layout.release(prev)) if prev != BASELINE else ""
    return _template(pf.root, "rollback.sh.j2").render(
        service=pf.service, release=release, previous_label=prev,
        state_dir=str(state.layout.base), dropin_path=dropin_path(pf.service),
        legacy_dropin_paths=legacy_dropin_paths(pf.service),
        previous_dropin=release_dropin_candidates(prev_dir) if prev_dir else [],
        previous_dropin_sha256=previous_sha256 if prev_dir else "",
        previous_current=prev_dir,
        restore_files=[{"backup": f"{state.layout.release(release.id)}/backup/{p}", "path": f"{release.site_packages}/{p}",
                        "sha256": base} for p, base in sorted(release.base_files.items())
                       if base and release.mode == "in-place"],
        remove_files=[f"{release.site_packages}/{p}" for p, base in sorted(release.base_files.items())
                      if not base and release.mode == "in-place"],
        unit_sha256=baseline.unit_sha256, unit_path=baseline.unit_path,
        sources=[{"path": p, "sha256": sha256(b)} for p, b in sorted(baseline.sources.items())],
    )


def render_release(t: TransportLike, pf: Preflight, state: HostState, release: Release) -> dict:
    """The drop-in, rollback.sh (and the guard unit) written, fsynced and linted in one command.
    rollback.sh holds the sha256 of the drop-in live now (the previous release's): taken from
    that release's render line in the ledger and checked in the same command against the live
    file; only where they differ (or the ledger has none) is rollback.sh written again."""
    text = dropin_text(pf, release)
    rdir = str(state.layout.release(release.id))
    live = (state.dropin, *legacy_dropin_paths(state.service)) if release.previous != BASELINE else ()
    guess = _rendered_sha(state, release.previous) if live else ""
    rollback = rollback_script(pf, state, release, guess)
    writes = [(f"{rdir}/unit/{DROPIN_NAME}", text.encode(), 0o644), (f"{rdir}/rollback.sh", rollback.encode(), 0o755)]
    if pf.guard:
        guard = _template(pf.root, "fleetspec-guard@.service.j2").render(state_root=str(state.layout.root))
        writes.append(("/etc/systemd/system/fleetspec-guard@.service", guard.encode(), 0o644))
    folders = [f"{rdir}/unit", rdir, *(["/etc/systemd/system"] if pf.guard else [])]
    done = systemd.write_and_verify(t, writes, folders, str(pf.layout.run), pf.service, pf.unit_bytes,
                                    DROPIN_NAME, writes[0][0], hash_paths=live)
    found = next((done.sha256[p] for p in live if p in done.sha256), "")
    if found != guess:
        files.write_file(t, f"{rdir}/rollback.sh", rollback_script(pf, state, release, found).encode(), 0o755)
    lint = lint_verdict(done.verify)
    return {"dropin_sha256": sha(text.encode()), "lint": lint}


def _rendered_sha(state: HostState, release_id: str) -> str:
    """The drop-in sha256 that `release_id`'s render step recorded, from the ledger the lock's
    holder read under the lock ("" when not there)."""
    text = state.lock.read_text if state.lock is not None else None
    for e in reversed(L.parse(text or "").entries):
        if e.kind == "step" and e.name == "render" and e.release == release_id and e.state == L.StepState.OK:
            return str(e.detail.get("dropin_sha256") or "")
    return ""


def lint_unit(t: TransportLike, pf: Preflight, dropin: str) -> str:
    """systemd-analyze verify on a scratch copy of the unit with the new drop-in, where present."""
    return lint_verdict(systemd.analyze_verify(t, str(pf.layout.run), pf.service, pf.unit_bytes, DROPIN_NAME,
                                               dropin.encode()))


def lint_verdict(r: CommandResult | None) -> str:
    """systemd-analyze verify's verdict on the rendered drop-in (pure): refused when verify failed
    naming the drop-in, ExecStart or an invalid setting, or when any line names the drop-in (a
    setting systemd would ignore); None (no systemd-analyze) is skipped."""
    if r is None:
        return "skipped (no systemd-analyze)"
    lines = (r.stderr + r.stdout).splitlines()
    bad = [line for line in lines if DROPIN_NAME in line or "ExecStart" in line or "Invalid" in line]
    ours = [line for line in lines if DROPIN_NAME in line]
    if (r.rc != 0 and bad) or ours:
        raise FleetspecError("systemd-analyze verify refused the rendered unit: " + " | ".join((ours or bad)[:3]))
    return "ok" if r.rc == 0 else "warnings: " + " | ".join((r.stderr + r.stdout).strip().splitlines()[:2])


def release_dropin_candidates(rdir: str) -> list[str]:
    """Where a release folder keeps its rendered drop-in: today's name first, then legacy ones."""
    return [f"{rdir}/unit/{n}" for n in (DROPIN_NAME, *LEGACY_DROPIN_NAMES)]

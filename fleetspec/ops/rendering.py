"""Render a release's drop-in and rollback.sh from the templates, and lint the unit with them.

The drop-in is what systemd runs; rollback.sh is the operator's way back without fleetspec.
Both land in the release folder; nothing that runs changes here.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fleetspec import render
from fleetspec.errors import FleetspecError
from fleetspec.model.release import BASELINE, Release
from fleetspec.ops.hoststate import DROPIN_NAME, LEGACY_DROPIN_NAMES, HostState, dropin_path, legacy_dropin_paths
from fleetspec.ops.staging import SECRETS_FILE, sha
from fleetspec.remote import files, systemd
from fleetspec.remote.api import TransportLike

if TYPE_CHECKING:
    from fleetspec.ops.preflight import Preflight


def _env(root: Path):
    env = render.environment(root)
    env.filters["q"] = shlex.quote
    return env


def dropin_text(pf: Preflight, release: Release) -> str:
    env_lines = [render.environment_line(k, v) for k, v in pf.environment(release).items()]
    for name in (release.launch or {}).get("env_dropped", []):   # speculation-only, dropped by the playbook
        env_lines.append(f"UnsetEnvironment={name}")
    if pf.playbook.launch.secret_env:   # values never in the drop-in (0644): a file only root reads
        env_lines.append(f"EnvironmentFile={pf.layout.release(release.id)}/{SECRETS_FILE}")
    return _env(pf.root).get_template("fleetspec-dropin.conf.j2").render(
        release=release, rendered_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        release_dir=str(pf.layout.release(release.id)), exec_line=render.exec_line(release.argv, release.exec_prefix, release.exec_path),
        environment_lines=env_lines, guard=pf.guard, service_escaped=pf.service.removesuffix(".service"),
    )


def rollback_script(pf: Preflight, state: HostState, release: Release, previous_dropin: bytes | None) -> str:
    prev = release.previous
    prev_dir = str(state.layout.release(prev)) if prev != BASELINE else ""
    return _env(pf.root).get_template("rollback.sh.j2").render(
        service=pf.service, release=release, previous_label=prev,
        state_dir=str(state.layout.base), dropin_path=dropin_path(pf.service),
        legacy_dropin_paths=legacy_dropin_paths(pf.service),
        previous_dropin=release_dropin_candidates(prev_dir) if prev_dir else [],
        previous_dropin_sha256=sha(previous_dropin) if (prev_dir and previous_dropin) else "",
        previous_current=prev_dir,
        restore_files=[{"backup": f"{state.layout.release(release.id)}/backup/{p}", "path": f"{release.site_packages}/{p}",
                        "sha256": base} for p, base in sorted(release.base_files.items())
                       if base and release.mode == "in-place"],
        remove_files=[f"{release.site_packages}/{p}" for p, base in sorted(release.base_files.items())
                      if not base and release.mode == "in-place"],
        unit_sha256=pf.baseline.unit_sha256, unit_path=pf.baseline.unit_path,
    )


def render_release(t: TransportLike, pf: Preflight, state: HostState, release: Release) -> dict:
    text = dropin_text(pf, release)
    rdir = str(state.layout.release(release.id))
    prev_dropin = state.dropin_bytes() if release.previous != BASELINE else None
    # both written, then made durable in one command (nothing uses them before `switch`)
    t.put_bytes(text.encode(), f"{rdir}/unit/{DROPIN_NAME}", mode=0o644, durable=False)
    t.put_bytes(rollback_script(pf, state, release, prev_dropin).encode(), f"{rdir}/rollback.sh", mode=0o755,
                durable=False)
    files.sync_paths(t, f"{rdir}/unit/{DROPIN_NAME}", f"{rdir}/rollback.sh", f"{rdir}/unit", rdir)
    if pf.guard:
        guard = _env(pf.root).get_template("fleetspec-guard@.service.j2").render(state_root=str(state.layout.root))
        t.put_bytes(guard.encode(), "/etc/systemd/system/fleetspec-guard@.service", mode=0o644)
    lint = lint_unit(t, pf, text)
    return {"dropin_sha256": sha(text.encode()), "lint": lint}


def lint_unit(t: TransportLike, pf: Preflight, dropin: str) -> str:
    """systemd-analyze verify on a scratch copy of the unit with the new drop-in, where present."""
    r = systemd.analyze_verify(t, str(pf.layout.run), pf.service, pf.unit_bytes, DROPIN_NAME, dropin.encode())
    if r is None:
        return "skipped (no systemd-analyze)"
    lines = (r.stderr + r.stdout).splitlines()
    bad = [line for line in lines if DROPIN_NAME in line or "ExecStart" in line or "Invalid" in line]
    ours = [line for line in lines if DROPIN_NAME in line]   # a setting systemd would ignore
    if (r.rc != 0 and bad) or ours:
        raise FleetspecError("systemd-analyze verify refused the rendered unit: " + " | ".join((ours or bad)[:3]))
    return "ok" if r.rc == 0 else "warnings: " + " | ".join((r.stderr + r.stdout).strip().splitlines()[:2])


def release_dropin_candidates(rdir: str) -> list[str]:
    """Where a release folder keeps its rendered drop-in: today's name first, then legacy ones."""
    return [f"{rdir}/unit/{n}" for n in (DROPIN_NAME, *LEGACY_DROPIN_NAMES)]

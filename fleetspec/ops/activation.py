"""Switch a host to a release, restart it, and switch back: the steps that change what runs.

Release mode: switching is one drop-in rename plus one symlink flip, both atomic. In-place mode
also replaces the live files (backed up and hash-checked first); reverting puts them back. Either
way the ledger says `switched` before the first write (ops/deploy.py).
"""

from __future__ import annotations

from pathlib import Path

from fleetspec import systemd_unit, unit_context
from fleetspec.model.baseline import Baseline
from fleetspec.model.release import Release
from fleetspec.ops import probes
from fleetspec.ops.hoststate import HostState, legacy_dropin_paths
from fleetspec.ops.rendering import release_dropin_candidates
from fleetspec.ops.staging import sha
from fleetspec.remote import files, release_files, systemd
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts.systemd import SystemdUnit


def activate(t: TransportLike, state: HostState, release: Release, after_files=None) -> SystemdUnit | None:
    """Point the service at `release`: files (in-place mode), drop-in renamed into place,
    `current` flipped, reload. `after_files` runs between the two (a test hook's pause point).
    Returns the unit as systemd holds it after the reload, read in the switch's own command."""
    rdir = str(state.layout.release(release.id))
    if release.mode == "in-place":
        release_files.apply_in_place(t, release, rdir)
        if after_files is not None:
            after_files()
    # A release folder made before the rename holds its drop-in under the legacy name.
    return release_files.switch_to(t, state.dropin, release_dropin_candidates(rdir),
                                   legacy_dropin_paths(state.service), rdir, str(state.layout.current),
                                   show=state.service)


def loaded_exec_start_mismatch(t: TransportLike, service: str, release: Release,
                               unit: SystemdUnit | None = None) -> str | None:
    """After daemon-reload, before the restart: does systemd now hold the derived ExecStart?
    An admin drop-in applied after fleetspec's (or one created since preflight) would leave the old
    command in place and the restart would serve it. None when it matches; else what differs.
    `unit`: what activate read after its reload (else read here)."""
    unit = systemd.show(t, service) if unit is None else unit
    return exec_start_mismatch(unit.exec_start, release.argv, release.exec_prefix, release.exec_path)


def exec_start_mismatch(shown: list, argv: list[str], prefix: str = "", path: str | None = None) -> str | None:
    """Compare `systemctl show -p ExecStart` (facts.systemd ExecInfo list) with the command fleetspec
    rendered. systemctl joins argv[] with spaces and prints it as stored (`$$` not yet expanded),
    so the comparison is made against the same stored form of the rendered line (pure)."""
    want = systemd_unit.parse_exec(systemd_unit.exec_line(argv, prefix, path))[0]
    if len(shown) != 1:
        return f"systemd holds {len(shown)} ExecStart= commands (expected 1)"
    got = shown[0]
    problems = []
    if " ".join(got.argv) != " ".join(want.argv):
        problems.append(f"argv is {' '.join(got.argv)[:300]!r}")
    if want.path.startswith("/") and got.path != want.path:
        problems.append(f"path is {got.path!r}, expected {want.path!r}")
    if got.ignore_errors != ("-" in prefix):
        problems.append(f"ignore_errors={'yes' if got.ignore_errors else 'no'}")
    return "; ".join(problems) or None


def leave(t: TransportLike, state: HostState, also=()) -> None:
    """Undo what the current release changed outside its own folder (in-place files), then what
    each release in `also` changed: one a deploy switched to but was cut off from before `current`
    pointed at it (its files may be in place, all or some)."""
    current = state.current()
    for rid in dict.fromkeys(r for r in (current, *also) if r):
        if state.release_exists(rid):
            release = state.read_release(rid)
            if release.mode == "in-place":
                release_files.undo_in_place(t, release, str(state.layout.release(rid)))


def deactivate(t: TransportLike, state: HostState, baseline: Baseline, also=()) -> None:
    """Back to the baseline: no fleetspec drop-in, no `current`, recorded unit and drop-ins byte-exact."""
    leave(t, state, also)
    release_files.remove_durably(t, [state.dropin, *legacy_dropin_paths(state.service), str(state.layout.current)])
    restore_baseline_files(t, baseline)
    systemd.daemon_reload(t)


def restore_baseline_files(t: TransportLike, baseline: Baseline) -> None:
    """Rewrite the unit file and admin drop-ins only where their bytes differ from the record, each
    with the mode it had (a 0600 drop-in holding a token stays 0600; unrecorded: 0644 unit, 0600 drop-in).
    A generated unit is not written: its source (a Quadlet file) is, and the reload regenerates it."""
    unit = {} if unit_context.is_generated(baseline.unit_path) else {baseline.unit_path: baseline.unit_bytes}
    wanted = {**unit, **baseline.sources, **baseline.dropins}
    got = files.sha256_map(t, wanted)
    for path, data in wanted.items():
        if got.get(path) != sha(data):
            default = 0o644 if path == baseline.unit_path or path in baseline.sources else 0o600
            t.put_bytes(data, path, mode=baseline.modes.get(path, default) & 0o7777)


def journal_tail(t: TransportLike, service: str, lines: int = 20) -> list[str]:
    return systemd.journal_tail(t, service, lines)


def revert_to(t: TransportLike, state: HostState, host, root: Path, baseline: Baseline, previous: str | None, *,
              progress=lambda _: None, also=()) -> probes.ProbeResult:
    """Switch to `previous` (a healthy release, or None for the baseline), restart, prove it.
    `also`: releases switched to without `current` pointing at them, whose in-place files to undo."""
    if previous is None:
        deactivate(t, state, baseline, also)
        expected = baseline.served_algorithm
    else:
        release = state.read_release(previous)
        leave(t, state, also)
        activate(t, state, release)
        expected = expected_algorithm(root, release.algo)
    return probes.wait_healthy(t, state.service, probes.spec_for_host(host, expected), restart=True,
                               progress=progress)


def expected_algorithm(root: Path, algo: str) -> str:
    from fleetspec.model.playbook import load_playbook_for

    return load_playbook_for(root, algo).speculative_algorithm

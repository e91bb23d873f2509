"""The shell that lays out, switches and reverts a release on a host (see ops/switching.py for when).

Release folders are built from the content-addressed store by remote/stage_host.py; in-place mode backs up and replaces
live files one by one, each copy hash-checked; switching renames fleetspec's drop-in into place,
flips `current` and reloads systemd in one round trip. Every word passes through shlex.quote.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

from fleetspec.model.release import Release
from fleetspec.remote import facts, files
from fleetspec.remote.api import TransportLike
from fleetspec.remote.facts import systemd as systemd_fact
from fleetspec.remote.facts.systemd import SystemdUnit
from fleetspec.remote.systemd import DAEMON_RELOAD

q = shlex.quote


def in_place_apply_script(release: Release, rdir: str) -> str:
    """Back up every file the patch set replaces (each copy hash-checked against the base), and
    only then replace the live files: a drifted base stops the script before any live write."""
    site = release.site_packages
    lines = ["set -e"]
    for path, base in sorted(release.base_files.items()):
        if base:
            live, backup = f"{site}/{path}", f"{rdir}/backup/{path}"
            lines.append(f"mkdir -p {q(str(PurePosixPath(backup).parent))}")
            lines.append(f"[ -e {q(backup)} ] || {{ {files.copy_atomic(live, backup, base)} || exit 1; }}")
    for path, sha in sorted(release.files.items()):
        live = f"{site}/{path}"
        lines.append(f"mkdir -p {q(str(PurePosixPath(live).parent))}")
        lines.append(files.copy_atomic(f"{rdir}/patch/{path}", live, sha) + " || exit 1")
        lines.append(_drop_pyc(live))
    return "\n".join(lines)


def in_place_undo_script(release: Release, rdir: str) -> str:
    """Put the backups back (hash-checked against the base) and remove added files. A file that
    already hashes as its base is left alone, so undoing a partly applied release works too."""
    site = release.site_packages
    lines = ["set -e"]
    for path in sorted(release.files):
        live, base = f"{site}/{path}", release.base_files.get(path)
        if base:
            pristine = f"printf '%s\\n' {q(base + '  ' + live)} | sha256sum -c --quiet --status 2>/dev/null"
            lines.append(f"{pristine} || {{ {files.copy_atomic(f'{rdir}/backup/{path}', live, base)} || exit 1; }}")
        else:
            lines.append(files.remove_script(live))
        lines.append(_drop_pyc(live))
    return "\n".join(lines)


def apply_in_place(t: TransportLike, release: Release, rdir: str) -> None:
    t.run_script(in_place_apply_script(release, rdir), timeout=300, check=True)


def undo_in_place(t: TransportLike, release: Release, rdir: str) -> None:
    t.run_script(in_place_undo_script(release, rdir), timeout=300, check=True)


def _drop_pyc(live: str) -> str:
    p = PurePosixPath(live)
    if p.suffix != ".py":
        return "true"
    return f"rm -f {q(str(p.parent / '__pycache__' / p.stem))}.*.pyc"


def _copy_dropin_from_var(dest: str) -> str:
    """Copy "$src" (set by the loop before it) to dest via a temp file and rename, fsyncing the copy
    before the rename and the folder after it."""
    tmp = dest + files.TMP_SUFFIX
    return (f'cp -p -- "$src" {q(tmp)} && {files.fsync(tmp)} && mv -f -- {q(tmp)} {q(dest)} && '
            f'{files.fsync(files.parent(dest))}')


def switch_to(t: TransportLike, dropin: str, candidates: list[str], legacy: list[str], rdir: str,
              current: str, show: str | None = None) -> SystemdUnit | None:
    """One round trip: the first of `candidates` that exists becomes `dropin`, the `legacy` drop-ins
    go, `current` points at `rdir`, systemd reloads; then, in the same command, the unit `show` as
    systemd now holds it (facts.systemd), returned."""
    src = " ".join(q(p) for p in candidates)
    script = " && ".join([
        f"mkdir -p {q(str(PurePosixPath(dropin).parent))}",
        f"for src in {src}; do [ -e \"$src\" ] && break; done",
        _copy_dropin_from_var(dropin),
        *[files.remove_durable_script(p) for p in legacy],
        files.symlink_atomic(rdir, current),
        DAEMON_RELOAD,
    ])
    if show is None:
        t.run_script(script, timeout=120, check=True)
        return None
    return facts.gather_many(t, [(systemd_fact, {"service": show})], timeout=120, errors="raise", before=script)[0]


def remove_durably(t: TransportLike, paths: list[str]) -> None:
    """Remove each path and fsync its folder, in one round trip."""
    t.run_script(" && ".join(files.remove_durable_script(p) for p in paths), timeout=60, check=True)

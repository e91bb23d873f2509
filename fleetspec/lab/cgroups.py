"""One cgroup per lab host, in every hierarchy except cpuset, below the caller's own cgroups.

systemd started from the machine's root cgroup once swept every process into a new scope (LAB.md),
and two containers in one cgroup collide; so the process that execs nspawn first moves itself
into `<its cgroup>/fleetspec-lab/<host>` in each hierarchy. Joining cpuset fails (ENOSPC), so it
is left alone. Removal is depth-first because the container's systemd creates its own children.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "fleetspec-lab"


def _mounts() -> list[tuple[frozenset, Path]]:
    """(mount options, mount point) per cgroup hierarchy; v2 has an empty option set here."""
    out: list[tuple[frozenset, Path]] = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _dev, mnt, fstype, opts, *_ = line.split()
        if fstype == "cgroup2":
            out.append((frozenset(), Path(mnt)))
        elif fstype == "cgroup":
            out.append((frozenset(opts.split(",")), Path(mnt)))
    return out


def _mount_for(controllers: str) -> Path | None:
    wanted = frozenset(c for c in controllers.split(",") if c)
    for opts, mnt in _mounts():
        if (not wanted and not opts) or (wanted and wanted <= opts):
            return mnt
    return None


def host_paths(name: str) -> list[Path]:
    """Where this host's cgroup goes in each hierarchy (cpuset excluded)."""
    paths = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        mnt = _mount_for(controllers)
        if "cpuset" in controllers.split(",") or mnt is None:
            continue
        here = rel.strip("/")
        # Already inside a lab cgroup (nested call): go back to its parent.
        if f"/{GROUP}/" in f"/{here}/":
            here = here[: f"/{here}".index(f"/{GROUP}")].strip("/")
        paths.append(mnt / here / GROUP / name)
    return paths


def enter(paths: list[Path]) -> None:
    """Move the calling process into each path (run in the child before exec)."""
    pid = str(os.getpid())
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
        (path / "cgroup.procs").write_text(pid)


def pids(paths: list[Path]) -> set[int]:
    found: set[int] = set()
    for path in paths:
        for procs in path.rglob("cgroup.procs") if path.is_dir() else []:
            try:
                found.update(int(p) for p in procs.read_text().split())
            except OSError:
                pass
    return found


def remove(paths: list[Path]) -> list[str]:
    """rmdir depth-first; returns what could not be removed (still has processes)."""
    left = []
    for path in paths:
        if not path.is_dir():
            continue
        for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                sub.rmdir()
            except OSError:
                left.append(str(sub))
        try:
            path.rmdir()
        except OSError:
            left.append(str(path))
        try:
            path.parent.rmdir()  # the fleetspec-lab folder, once the last host is gone
        except OSError:
            pass
    return left


def leftovers() -> list[Path]:
    """Every fleetspec-lab cgroup folder on the machine (for `lab down` after a crash)."""
    found: list[Path] = []
    for _opts, mnt in _mounts():
        for depth in range(0, 4):
            found.extend(p for p in mnt.glob("/".join(["*"] * depth + [GROUP])) if p.is_dir())
    return found

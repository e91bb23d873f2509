"""Finding the fleet root: the folder holding inventory/, playbooks/ and templates/."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fleetspec.errors import UserError

MARKERS = ("inventory", "playbooks", "templates")


def is_fleet_root(path: Path) -> bool:
    return all((path / m).is_dir() for m in MARKERS)


def find_root(explicit: str | os.PathLike | None = None, cwd: Path | None = None) -> Path:
    """--root wins, then $FLEETSPEC_ROOT, then the nearest folder above cwd with all three markers.
    Run as root, the fleet root must be one only root can change (check_trusted)."""
    for source, value in (("--root", explicit), ("FLEETSPEC_ROOT", os.environ.get("FLEETSPEC_ROOT"))):
        if value:
            path = Path(value).expanduser().resolve()
            if not is_fleet_root(path):
                raise UserError(f"{source}={value}: not a fleet root (expected folders {', '.join(MARKERS)})")
            return _trusted(path)
    here = (cwd or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if is_fleet_root(candidate):
            return _trusted(candidate)
    raise UserError(
        f"no fleet root above {here}: expected folders {', '.join(MARKERS)} (use --root or FLEETSPEC_ROOT)"
    )


def _trusted(root: Path) -> Path:
    if os.geteuid() == 0:
        check_trusted(root)
    return root


def check_trusted(root: Path, uid: int = 0) -> None:
    """As ssh's StrictModes: root runs what a fleet root says (inventory, playbooks and their patch
    sets, templates), so the folder, every folder above it and everything in inventory/,
    playbooks/ and templates/ must belong to `uid` (or root) and be writable by no one else. A
    folder above may be world-writable only with the sticky bit (/tmp: others cannot replace
    what root owns there). UserError naming the first path that fails and what to do."""
    def owner_only(path: Path, st: os.stat_result, above: bool = False) -> None:
        if st.st_uid not in (0, uid):
            raise UserError(f"fleet root {root}: {path} belongs to uid {st.st_uid}, not root: refusing to use "
                            f"files others can change as root (chown it, or run from a root-owned copy)")
        sticky = above and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and not sticky:
            raise UserError(f"fleet root {root}: {path} is writable by group or others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): refusing to use it as root (chmod go-w {path})")

    owner_only(root, root.stat())
    for folder in root.parents:
        owner_only(folder, folder.stat(), above=True)
    for marker in MARKERS:
        for top, dirs, names in os.walk(root / marker):
            for name in [*dirs, *names]:
                path = Path(top) / name
                try:
                    st = path.stat()
                except OSError:          # a dangling link: nothing there to run
                    continue
                owner_only(path, st)
        owner_only(root / marker, (root / marker).stat())

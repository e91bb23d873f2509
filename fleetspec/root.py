"""Finding the fleet root: the folder holding inventory/, playbooks/ and templates/."""

from __future__ import annotations

import os
from pathlib import Path

from fleetspec.errors import UserError

MARKERS = ("inventory", "playbooks", "templates")


def is_fleet_root(path: Path) -> bool:
    return all((path / m).is_dir() for m in MARKERS)


def find_root(explicit: str | os.PathLike | None = None, cwd: Path | None = None) -> Path:
    """--root wins, then $FLEETSPEC_ROOT, then the nearest folder above cwd with all three markers."""
    for source, value in (("--root", explicit), ("FLEETSPEC_ROOT", os.environ.get("FLEETSPEC_ROOT"))):
        if value:
            path = Path(value).expanduser().resolve()
            if not is_fleet_root(path):
                raise UserError(f"{source}={value}: not a fleet root (expected folders {', '.join(MARKERS)})")
            return path
    here = (cwd or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if is_fleet_root(candidate):
            return candidate
    raise UserError(
        f"no fleet root above {here}: expected folders {', '.join(MARKERS)} (use --root or FLEETSPEC_ROOT)"
    )

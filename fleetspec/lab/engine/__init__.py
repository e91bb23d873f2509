"""The engine stand-in's source, as shipped onto lab hosts (see fleetspec_lab_engine/__init__.py).

`files()` lists what `lab up` copies into each host venv's site-packages: the package itself and
the `.pth` hook that makes `python -m sglang.launch_server` run it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).parent / "fleetspec_lab_engine"
PTH_NAME = "fleetspec-lab-engine.pth"
# site.py executes .pth lines that start with "import"; keep it one cheap line.
PTH_LINE = "import fleetspec_lab_engine.hook as _h; _h.install()\n"


def files() -> dict[str, bytes]:
    """Relative path under site-packages -> bytes."""
    out = {PTH_NAME: PTH_LINE.encode()}
    for path in sorted(PACKAGE.glob("*.py")):
        out[f"fleetspec_lab_engine/{path.name}"] = path.read_bytes()
    return out

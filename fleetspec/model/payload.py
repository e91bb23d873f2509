"""The DDTree payload's modules, loaded by fleetspec from their one source file.

The payload (`playbooks/ddtree/payload/`) runs on hosts inside sglang, where fleetspec is not
installed, so it can import nothing of fleetspec. Where fleetspec needs a rule the payload also
enforces (the hybrid-target rule), it loads the payload's file instead of keeping a copy; tests and
bench load the tree builder the same way.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PAYLOAD_DIR = Path(__file__).resolve().parents[2] / "playbooks" / "ddtree" / "payload"


def load(name: str, module_name: str | None = None) -> ModuleType:
    """`payload/<name>.py` as a module, registered as `module_name` (default
    `fleetspec_payload_<name>`) and loaded once per module name: a caller that needs its own copy
    (its own module globals, e.g. a kernel loaded into it) passes a name of its own."""
    module_name = module_name or f"fleetspec_payload_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = PAYLOAD_DIR / f"{name}.py"
    if not path.is_file():
        raise ImportError(f"{path}: the DDTree payload is missing (fleetspec runs from its source "
                          f"checkout, installed with pip install -e .)")
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None   # a .py path always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module

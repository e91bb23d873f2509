"""paramiko, imported without `invoke`.

paramiko.config imports `invoke` (and with it asyncio and unittest.mock: about 50 ms of every CLI
start) only to run ssh_config's `Match exec`; fleetspec reads no ssh_config. The name is blocked
for paramiko's import only, so anything else in the process may still import invoke.
"""

from __future__ import annotations

import sys

_blocked = "invoke" not in sys.modules
if _blocked:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` then raises ImportError
try:
    import paramiko
finally:
    if _blocked and "invoke" in sys.modules and sys.modules["invoke"] is None:
        del sys.modules["invoke"]

__all__ = ["paramiko"]

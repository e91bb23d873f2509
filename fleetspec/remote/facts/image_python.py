"""The engine's python inside a container's image: which sglang and torch it has and where sglang
is installed, read without importing either (importlib.metadata, find_spec), in a throwaway
container of the unit's own image, mounts and environment (container_launch.smoke_argv). Preflight
reads sglang's files on the host with the inventory's python; this is how it knows the container
runs that same install, not another version an image carries at the same path."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

SNIPPET = (
    "import importlib.metadata as m, importlib.util as u, json, sys\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except Exception:\n"
    "        return None\n"
    "s = u.find_spec(\"sglang\")\n"
    "print(json.dumps({\"python\": sys.executable, \"sglang\": v(\"sglang\"), \"torch\": v(\"torch\"),\n"
    "                  \"sglang_path\": list(s.submodule_search_locations or [None])[0] if s else None}))\n"
)


@dataclass(frozen=True)
class ImagePython:
    python: str
    sglang: str | None
    sglang_path: str | None          # the package's folder, e.g. …/site-packages/sglang
    torch: str | None


def command(argv: tuple[str, ...]) -> str:
    """`argv`: the runtime's command line whose python runs SNIPPET (ends with `-c SNIPPET`)."""
    return shlex.join(argv)


def parse(stdout: str, argv: tuple[str, ...] = ()) -> ImagePython:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise ValueError(f"no JSON line in the image's python output: {stdout.strip()[-200:]!r}")
    raw = json.loads(lines[-1])
    if not isinstance(raw, dict) or not isinstance(raw.get("python"), str):
        raise ValueError(f"unexpected output of the image's python: {lines[-1][:200]!r}")
    return ImagePython(python=raw["python"], sglang=raw.get("sglang"), sglang_path=raw.get("sglang_path"),
                       torch=raw.get("torch"))

"""The engine's python inside a container's image: which sglang and torch it has and where sglang
is installed, read without importing either (importlib.metadata, find_spec), in a throwaway
container of the unit's own image, mounts and environment (container_launch.smoke_argv). Preflight
reads sglang's files on the host with the inventory's python; this is how it knows the container
runs that same install, not another version an image carries at the same path; and, with the
sglang fact's own snippet run after it, that the image's sglang files are still what pip recorded
(RECORD) and what the patch set's paths hash to inside the image, as preflight reads them on the
host."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from fleetspec.remote.facts import sglang as sglang_fact
from fleetspec.remote.facts.sglang import SglangInstall

# FLEETSPEC_CHECK_PATHS (a JSON list, set with -e on the throwaway container): the model paths the
# new launch names, looked for inside the container, where the engine will open them.
CHECK_PATHS = "FLEETSPEC_CHECK_PATHS"
_OWN = (
    "import importlib.metadata as m, importlib.util as u, json, os, sys\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except Exception:\n"
    "        return None\n"
    "s = u.find_spec(\"sglang\")\n"
    "print(json.dumps({\"python\": sys.executable, \"sglang\": v(\"sglang\"), \"torch\": v(\"torch\"),\n"
    "                  \"sglang_path\": list(s.submodule_search_locations or [None])[0] if s else None,\n"
    "                  \"missing\": [p for p in json.loads(os.environ.get(\"FLEETSPEC_CHECK_PATHS\") or \"[]\")\n"
    "                              if not os.path.exists(p)]}))\n"
)
# Two JSON lines: _OWN's, then the sglang fact's (which hashes the paths given after `-c SNIPPET`).
SNIPPET = _OWN + sglang_fact.SNIPPET


@dataclass(frozen=True)
class ImagePython:
    python: str
    sglang: str | None
    sglang_path: str | None          # the package's folder, e.g. …/site-packages/sglang
    torch: str | None
    install: SglangInstall           # the image's sglang files against its RECORD; `hashes` of hash_paths
    missing: tuple[str, ...] = ()    # of the CHECK_PATHS asked for, those not there inside the container


def command(argv: tuple[str, ...], hash_paths: tuple[str, ...] = ()) -> str:
    """`argv`: the runtime's command line whose python runs SNIPPET (ends with `-c SNIPPET`);
    `hash_paths` (under site-packages) follow it as the snippet's arguments."""
    return shlex.join((*argv, *hash_paths))


def parse(stdout: str, argv: tuple[str, ...] = (), hash_paths: tuple[str, ...] = ()) -> ImagePython:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise ValueError(f"no JSON line in the image's python output: {stdout.strip()[-200:]!r}")
    raw = json.loads(lines[0])
    if not isinstance(raw, dict) or not isinstance(raw.get("python"), str):
        raise ValueError(f"unexpected output of the image's python: {lines[0][:200]!r}")
    if len(lines) < 2:
        raise ValueError(f"the image's python did not check sglang's files: {stdout.strip()[-200:]!r}")
    missing = raw.get("missing") or []
    if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
        raise ValueError(f"unexpected missing paths from the image's python: {str(missing)[:200]!r}")
    return ImagePython(python=raw["python"], sglang=raw.get("sglang"), sglang_path=raw.get("sglang_path"),
                       torch=raw.get("torch"), install=sglang_fact.parse(lines[1], raw["python"], hash_paths),
                       missing=tuple(missing))

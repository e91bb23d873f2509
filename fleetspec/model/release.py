"""A release: one attempt to put an algo on a service. Its manifest lives in releases/<id>/."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fleetspec.model import hostjson
from fleetspec.model.names import check_name, relpath_problem

BASELINE = "baseline"


def new_release_id(algo: str, now: float | None = None) -> str:
    """Sortable by time, unique without coordination, and readable in `ls`."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    return f"{stamp}-{algo}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class Release:
    id: str
    host: str
    service: str
    algo: str
    mode: str                      # release | in-place
    sglang_version: str
    argv: list[str]                # the new ExecStart
    previous: str                  # release id or "baseline": where a revert goes
    patchset: str | None = None    # folder name of the patch set
    files: dict[str, str] = field(default_factory=dict)      # package path -> sha256
    kernels: dict[str, str] = field(default_factory=dict)    # file name -> sha256
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    site_packages: str | None = None                        # where in-place mode writes
    base_files: dict[str, str | None] = field(default_factory=dict)  # path -> base sha256 (None: added)
    exec_prefix: str = ""          # the baseline ExecStart's prefix characters (-, @, :, +, !, !!), kept
    exec_path: str | None = None   # the executable, when `@` makes argv[0] a separate name
    launch: dict[str, Any] = field(default_factory=dict)   # form, kept/dropped/carried/added tokens, env verdicts

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Release":
        """A manifest read back from a host: its names become path parts, so each is checked."""
        release = cls(**hostjson.loads_object(text, "the release manifest"))
        check_name(release.id, "release id")
        check_name(release.previous, "previous release id")
        for path in [*release.files, *release.base_files]:
            problem = relpath_problem(path)
            if problem:
                raise ValueError(f"release {release.id}: file paths must be {problem}")
        for name in release.kernels:
            check_name(name, "kernel file name")
        return release

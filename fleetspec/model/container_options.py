"""Which options of a container runtime take a value (pure): the table the `docker run` /
`podman run` argv parser splits with.

Both programs parse with cobra/pflag and print one line per flag in `--help`:
`  -p, --publish list   …` (a type word after the name: it takes a value) or `      --rm   …`
(none: a boolean, which may still be written `--rm=false`). The packaged tables
(fleetspec/model/container_options/<runtime>.json) hold what `options_from_help` reads from the
real programs' help (docker 28.2.2, podman 4.3.1; the captured text is in
tests/fixtures/containers/, and tests compare) plus flags the help hides or that newer versions
add, each with where it is documented (`extra`). An option missing from the table is refused:
fleetspec could not tell where the image starts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLES = Path(__file__).parent / "container_options"
RUNTIMES = ("docker", "podman")
_LINE = re.compile(r"^ {2,}(?:-(?P<short>[A-Za-z0-9]), )?--(?P<long>[A-Za-z0-9][A-Za-z0-9-]*)"
                   r"(?: (?P<type>\S+))?(?: {2,}|$)")


def options_from_help(text: str) -> dict[str, bool]:
    """`--name`/`-x` -> takes a value, from cobra's `--help` output."""
    out: dict[str, bool] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        takes = m.group("type") is not None
        out["--" + m.group("long")] = takes
        if m.group("short"):
            out["-" + m.group("short")] = takes
    return out


@dataclass(frozen=True)
class RuntimeOptions:
    """One runtime's options: `run` for `<runtime> run`, `main` for the program's own (global) ones."""

    runtime: str
    version: str
    run: dict[str, bool]
    main: dict[str, bool]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeOptions:
        extra = data.get("extra", {})
        run = {**data["run"], **{k: bool(v["value"]) for k, v in extra.get("run", {}).items()}}
        main = {**data["main"], **{k: bool(v["value"]) for k, v in extra.get("main", {}).items()}}
        return cls(runtime=str(data["runtime"]), version=str(data["version"]), run=run, main=main)


def load(runtime: str) -> RuntimeOptions:
    """The packaged table of `runtime` (docker | podman)."""
    return RuntimeOptions.from_dict(json.loads((TABLES / f"{runtime}.json").read_text()))


def table_data(runtime: str, version: str, run_help: str, main_help: str,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the packaged JSON holds for one runtime (tests rebuild it from the captured help)."""
    return {"runtime": runtime, "version": version, "run": dict(sorted(options_from_help(run_help).items())),
            "main": dict(sorted(options_from_help(main_help).items())), "extra": extra or {}}

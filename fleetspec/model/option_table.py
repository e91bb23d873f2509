"""sglang's server parser as a table (option string -> dest, nargs), per version (pure).

The packaged tables (fleetspec/model/sglang_options/<version>.json) are written by
fleetspec.lab.optiontable from the real parsers; for a version without one, DUMP_SCRIPT is run by
the host's own python and parse_dump reads its output. model/launch.py splits ARGS with them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLES = Path(__file__).parent / "sglang_options"
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class OptionTable:
    """sglang's server parser for one version: option string -> (dest, nargs code)."""

    version: str
    options: dict[str, tuple[str, str]]      # nargs code: "0", "1" (None), "?", "*", "+", "N"
    allow_abbrev: bool = True
    negative_number_optionals: bool = False
    required: tuple[str, ...] = ()           # dests argparse insists on (--model-path)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OptionTable":
        return cls(version=data["version"], options={k: (v[0], v[1]) for k, v in data["options"].items()},
                   allow_abbrev=bool(data.get("allow_abbrev", True)),
                   negative_number_optionals=bool(data.get("negative_number_optionals", False)),
                   required=tuple(data.get("required", ())))

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "allow_abbrev": self.allow_abbrev,
                "negative_number_optionals": self.negative_number_optionals, "required": list(self.required),
                "options": {k: list(v) for k, v in sorted(self.options.items())}}

    def dests(self) -> set[str]:
        return {d for d, _ in self.options.values()}

    def resolve(self, token: str) -> tuple[str | None, str | None, str] | None:
        """argparse's `_parse_optional` (Python 3.11): None when the token is an argument;
        else (option string or None when unknown, explicit `=value` or None, verdict) with verdict
        'ok', 'unknown' or 'ambiguous'."""
        if not token or token[0] != "-" or token == "-":
            return None
        if token in self.options:
            return token, None, "ok"
        if "=" in token:
            name, value = token.split("=", 1)
            if name in self.options:
                return name, value, "ok"
        matches = self._prefix_matches(token)
        if len(matches) > 1:
            return None, None, "ambiguous"
        if len(matches) == 1:
            return matches[0][0], matches[0][1], "ok"
        if _NEGATIVE_NUMBER.match(token) and not self.negative_number_optionals:
            return None
        if " " in token:
            return None
        return None, None, "unknown"

    def _prefix_matches(self, token: str) -> list[tuple[str, str | None]]:
        out = []
        if token.startswith("--"):
            if not self.allow_abbrev:
                return []
            prefix, eq, value = token.partition("=")
            explicit = value if eq else None
            for opt in self.options:
                if opt.startswith(prefix):
                    out.append((opt, explicit))
        else:
            short, short_explicit = token[:2], token[2:]
            for opt in self.options:
                if opt == short:
                    out.append((opt, short_explicit))
                elif opt.startswith(token):
                    out.append((opt, None))
        return out


def load_table(version: str) -> OptionTable | None:
    """The packaged table of a version's parser, or None (then the caller asks the host's parser)."""
    path = TABLES / f"{version}.json"
    if not path.is_file():
        return None
    return OptionTable.from_dict(json.loads(path.read_text()))


def known_versions() -> list[str]:
    return sorted(p.stem for p in TABLES.glob("*.json"))


# The dump script: run by the version's own python (lab/optiontable.py locally, preflight on a host
# whose version has no packaged table). It builds the parser exactly as prepare_server_args does.
DUMP_SCRIPT = r'''
import argparse, json, sys
import sglang
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(p)
opts, positionals, required = {}, [], []
for a in p._actions:
    if not a.option_strings:
        positionals.append(a.dest)
    elif a.required:
        required.append(a.dest)
    for s in a.option_strings:
        opts[s] = [a.dest, "1" if a.nargs is None else str(a.nargs)]
sys.stdout.write("\nFLEETSPEC-OPTIONS " + json.dumps({"version": sglang.__version__, "allow_abbrev": p.allow_abbrev,
    "negative_number_optionals": bool(p._has_negative_number_optionals), "positionals": positionals,
    "required": sorted(required),
    "options": opts}, sort_keys=True) + "\n")
'''


def parse_dump(stdout: str) -> OptionTable:
    for line in reversed(stdout.splitlines()):
        if line.startswith("FLEETSPEC-OPTIONS "):
            data = json.loads(line.split(" ", 1)[1])
            if data.get("positionals"):
                raise ValueError(f"sglang's parser has positional arguments {data['positionals']}")
            return OptionTable.from_dict(data)
    raise ValueError("the option dump printed no FLEETSPEC-OPTIONS line")

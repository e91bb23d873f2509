"""The secrets fleetspec holds for a host (the inventory's api_key, the playbook's launch.secret_env,
and the values of sglang's secret options in the ExecStart it found): which they are, that they are
usable, and their values taken out of any text it prints or records."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

from fleetspec.errors import UserError
from fleetspec.model.inventory import Host
from fleetspec.model.playbook import Playbook
from fleetspec.secrets import NOT_SECRET_OPTIONS, PLACEHOLDER, SECRET_OPTIONS


def secrets_of(host: Host, playbook: Playbook) -> list[str]:
    """Every secret value fleetspec holds for this host and playbook (never printed or recorded)."""
    values = [host.vars.api_key.value()] if host.vars.api_key else []
    values += [os.environ.get(name) for name in playbook.launch.secret_env]
    return [v for v in values if v]


def secret_refs(host: Host, playbook: Playbook | None = None) -> tuple[list[str], list[str]]:
    """(names, values) of the variables whose values are never shown: the inventory's api_key
    and the playbook's launch.secret_env (pattern-named ones are caught by model.baseline)."""
    names = [host.vars.api_key.env] if host.vars.api_key else []
    names += list(playbook.launch.secret_env) if playbook is not None else []
    return names, secrets_of(host, playbook) if playbook is not None else \
        [v for v in [host.vars.api_key.value() if host.vars.api_key else None] if v]


# sglang's secret options: fleetspec/secrets.py (argparse takes a unique prefix too)
_OPT = "|".join(re.escape(o) for o in SECRET_OPTIONS)
_BY_NAME = (
    (re.compile(rf'("(?:{_OPT})"\s*,\s*")((?:[^"\\]|\\.)*)(")'), rf"\1{PLACEHOLDER}\3"),    # JSON list
    (re.compile(rf'("(?:{_OPT})=)((?:[^"\\]|\\.)*)(")'), rf"\1{PLACEHOLDER}\3"),                # JSON "--opt=V"
    (re.compile(rf"((?:{_OPT})=)((?:[^\"'\\\s]|\\.)+)"), rf"\1{PLACEHOLDER}"),                 # --opt=V
    (re.compile(rf"((?:{_OPT})[ \t]+)('[^']*'|\"(?:[^\"\\]|\\.)*\"|[^\s\"',\]]+)"), rf"\1{PLACEHOLDER}"),
)


def is_secret_option(word: str) -> bool:
    name = word.split("=", 1)[0]
    return name.startswith("--") and len(name) > 3 and name not in NOT_SECRET_OPTIONS and any(
        o.startswith(name) for o in SECRET_OPTIONS)


def argv_secrets(argv: Iterable[str]) -> list[str]:
    """The values an argv gives sglang's secret options (`--opt V`, `--opt=V`, a unique prefix),
    and a container runtime's `-e NAME=VALUE` of a secret-looking name (`--env NAME=V`,
    `--env=NAME=V`, `-eNAME=V`, `-ie NAME=V`: the runtime's words are kept as written)."""
    from fleetspec.model.baseline import is_secret

    argv, out = list(argv), []
    for i, word in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if is_secret_option(word):
            out.append(word.split("=", 1)[1] if "=" in word else nxt)
            continue
        assignment = (nxt if word == "--env" or _SHORT_E.fullmatch(word) else word[6:] if word.startswith("--env=")
                      else word[2:] if word.startswith("-e") and "=" in word else "")
        name, eq, value = assignment.partition("=")
        if eq and value and is_secret(name, value):
            out.append(value)
    return [v for v in out if v]


_SHORT_E = re.compile(r"-[a-zA-Z]*e")    # `-e`, or a cluster of short flags ending in it (`-ie`)


def redact_options(text: str) -> str:
    """Values written after a secret option's name, in a command line or a JSON argv list: for
    text whose argv fleetspec does not hold (an older ledger line read back)."""
    for pattern, repl in _BY_NAME:
        text = pattern.sub(repl, text)
    return text


def redact(text: str, host: Host, playbook: Playbook, argv: Iterable[str] = ()) -> str:
    """`text` without the host's secret values (raw and JSON-escaped) nor the values of secret
    options in `argv` (the ExecStart found and the one derived), wherever they appear."""
    for value in sorted(secrets_of(host, playbook), key=len, reverse=True):
        for form in dict.fromkeys([value, json.dumps(value)[1:-1]]):
            text = text.replace(form, PLACEHOLDER)
    for value in sorted(set(argv_secrets(argv)), key=len, reverse=True):
        for form in dict.fromkeys([value, json.dumps(value)[1:-1]]):
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(form)}(?![A-Za-z0-9])", PLACEHOLDER, text)
    return redact_options(text)


def check_secret_env(host: Host, playbook: Playbook) -> None:
    for name in playbook.launch.secret_env:
        if not (name[:1].isalpha() or name[:1] == "_") or not name.replace("_", "a").isalnum():
            raise UserError(f"{playbook.path}: launch.secret_env: {name!r} is not an environment variable name")
        value = os.environ.get(name)
        if value is None or value == "":
            raise UserError(f"{host.name}: {playbook.path}: launch.secret_env names {name}, which is not set in "
                            f"fleetspec's environment")
        if "\n" in value or "\0" in value:
            raise UserError(f"{host.name}: the value of {name} (launch.secret_env) holds a newline or NUL")

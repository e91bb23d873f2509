"""The secrets fleetspec holds for a host (the inventory's api_key, the playbook's launch.secret_env):
which they are, that they are usable, and their values taken out of any text it prints or records."""

from __future__ import annotations

import json
import os

from fleetspec.errors import UserError
from fleetspec.model.inventory import Host
from fleetspec.model.playbook import Playbook


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


def redact(text: str, host: Host, playbook: Playbook) -> str:
    for value in sorted(secrets_of(host, playbook), key=len, reverse=True):
        for form in dict.fromkeys([value, json.dumps(value)[1:-1]]):
            text = text.replace(form, "<redacted>")
    return text


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

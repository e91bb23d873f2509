"""Playbook option overrides: `deploy --set NAME=VALUE` and `bench --algo ALGO:NAME=VALUE,…`.

One parser for both, so what the CLI accepts is what the tests check; the value takes the type of
the option's default in the playbook.
"""

from __future__ import annotations

from typing import Any

from fleetspec.errors import UserError
from fleetspec.model.playbook import Playbook, Scalar

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def coerce_option(playbook: Playbook, name: str, text: str, flag: str = "--set") -> Scalar:
    """A `NAME=VALUE` string typed by the option's default: bool (true/false, yes/no, on/off, 1/0,
    any case), int, finite float, or str; anything else is one line naming the option, the
    expected type and the playbook file."""
    if name not in playbook.options:
        known = ", ".join(playbook.options) or "none"
        raise UserError(f"{flag} {name}: {playbook.path.name} has no option {name!r} (options: {known})")
    default = playbook.options[name]
    low = text.strip().lower()
    try:
        if isinstance(default, bool):
            if low not in _TRUE + _FALSE:
                raise ValueError
            return low in _TRUE
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            if low.lstrip("+-") in ("nan", "inf", "infinity"):
                raise ValueError
            return float(text)
    except ValueError:
        expected = "bool (true/false, yes/no, on/off, 1/0)" if isinstance(default, bool) else type(default).__name__
        raise UserError(f"{flag} {name}={text}: expected {expected} like the default {default!r} "
                        f"in {playbook.path}") from None
    return text


def parse_overrides(playbook: Playbook, pairs: list[str] | tuple[str, ...], flag: str = "--set") -> dict[str, Scalar]:
    """The one parser of option overrides (`deploy --set`, `bench --algo A:NAME=VALUE,…`)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UserError(f"{flag} {pair!r}: expected NAME=VALUE")
        out[name.strip()] = coerce_option(playbook, name.strip(), text, flag)
    return out

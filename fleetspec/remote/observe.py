"""Observers of every remote action (`-v/--verbose`), and the redaction applied before they see it."""

from __future__ import annotations

import time

from fleetspec import secrets

# Observers of every remote action (`-v/--verbose`): fn(host, what, seconds, outcome). The one hook
# sits here, in the one SSH place, so nothing fleetspec runs on a host escapes it.
_OBSERVERS: list = []


def add_observer(fn) -> None:
    """Call fn(host_name, shown_command, seconds, outcome) after each command or HTTP request."""
    _OBSERVERS.append(fn)


def remove_observer(fn) -> None:
    if fn in _OBSERVERS:
        _OBSERVERS.remove(fn)


# Observers of each new connection's route (`-v`): fn(host, text, seconds). Apart from the
# commands' observers, which count round trips (bench/counted.py, tests): a connect is not one.
_ROUTE_OBSERVERS: list = []


def add_route_observer(fn) -> None:
    """Call fn(host_name, route, seconds) when a connection is made: the route and what set it."""
    _ROUTE_OBSERVERS.append(fn)


def remove_route_observer(fn) -> None:
    if fn in _ROUTE_OBSERVERS:
        _ROUTE_OBSERVERS.remove(fn)


def _observe_route(host: str, text: str, began: float) -> None:
    for fn in list(_ROUTE_OBSERVERS):
        try:
            fn(host, text, time.monotonic() - began)
        except Exception:  # a broken observer must not break a connect
            pass


def redact(text: str) -> str:
    """Values after secret-looking names (--api-key X, SGLANG_API_KEY=X, Authorization: …) hidden."""
    return secrets.redact_named(text)


def _observe(host: str, what: str, began: float, outcome: str) -> None:
    if not _OBSERVERS:
        return
    seconds = time.monotonic() - began
    shown = redact(what)
    for fn in list(_OBSERVERS):
        try:
            fn(host, shown, seconds, outcome)
        except Exception:  # a broken observer must not break a deploy
            pass

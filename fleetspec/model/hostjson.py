"""JSON that a host sent (answers, fact output, ledger lines, records): one loader, so a hostile
host's deep nesting is a ValueError like any other malformed text, never a RecursionError that
escapes the error handling of a deploy, its revert or a fleet."""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """json.loads; ValueError for anything that is not JSON fleetspec can hold (nesting too deep)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def loads_object(text: str | bytes, what: str) -> dict[str, Any]:
    """A JSON object, or ValueError naming `what` (an answer that is a list or a string)."""
    value = loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a JSON object (got {type(value).__name__})")
    return value

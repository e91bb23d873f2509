"""Fact parsers against recorded outputs, one JSON case per output (as pyinfra's fact tests are).

`tests/fixtures/facts/<fact>/<case>.json` holds `source` (where the output came from: captured on
the lab, or written by hand and from what), `params` (the fact's keyword arguments), `stdout` (or
`body`, the parsed JSON an HTTP fact receives), and then either `expected` (the parsed dataclass as
`dataclasses.asdict` gives it, with `properties` for computed attributes, `__str__` for `str()`)
or `raises` (`type`, `match`). A new captured output is a new JSON file, not new test code.
"""

from __future__ import annotations

import base64
import builtins
import importlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

CASES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
CASES = sorted(CASES_DIR.glob("*/*.json"))
KEYS = {"source", "params", "stdout", "body", "expected", "properties", "raises"}


def normalize(value: Any) -> Any:
    """A parsed value as JSON holds it: tuples as lists, bytes as {"utf8": …} or {"base64": …}."""
    if isinstance(value, bytes):
        try:
            return {"utf8": value.decode("utf-8")}
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(k): normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    return value


def load_case(fact: str, case: str) -> dict[str, Any]:
    return json.loads((CASES_DIR / fact / f"{case}.json").read_text())


def parse_case(fact: str, case: dict[str, Any]) -> Any:
    module = importlib.import_module(f"fleetspec.remote.facts.{fact}")
    given = case["body"] if "body" in case else case["stdout"]
    return module.parse(given, **case["params"])


def test_cases_exist():
    assert len(CASES) >= 25, f"expected the fact cases under {CASES_DIR}"


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fact_case(path: Path):
    case = json.loads(path.read_text())
    assert set(case) <= KEYS, f"{path}: unknown keys {sorted(set(case) - KEYS)}"
    assert case.get("source"), f"{path}: say where the output came from"
    assert ("stdout" in case) != ("body" in case) and ("expected" in case) != ("raises" in case), path
    fact = path.parent.name
    if "raises" in case:
        module = importlib.import_module(f"fleetspec.remote.facts.{fact}")
        kind = case["raises"]["type"]
        error = getattr(module, kind, None) or getattr(builtins, kind)
        with pytest.raises(error, match=case["raises"]["match"]):
            parse_case(fact, case)
        return
    result = parse_case(fact, case)
    got = normalize(asdict(result))
    assert got == case["expected"]
    assert json.dumps(got) == json.dumps(case["expected"]), f"{path}: same values, another order"
    for name, want in case.get("properties", {}).items():
        got = str(result) if name == "__str__" else getattr(result, name)
        assert normalize(got) == want, f"{path}: property {name}"

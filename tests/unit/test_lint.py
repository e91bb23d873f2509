"""The code's habits, run by the test command: ruff and mypy as pyproject.toml configures them, and
the shape the issue asks of `fleetspec/` (no module over 400 lines, no function over 60).

Each test fails with the offenders listed. A missing ruff or mypy is a skip on a developer's
machine and a failure under CI (tests/conftest.py), so a set-up that forgot them cannot pass.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fleetspec"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _tool(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_ruff():
    r = _tool("ruff", "check", "--no-cache", "--output-format", "concise", ".", timeout=120)
    if r.returncode:
        pytest.fail(f"ruff check found problems:\n{r.stdout}{r.stderr}", pytrace=False)


def test_mypy():
    # A cache per checkout outside it: the second run takes seconds, and nothing is left in the tree.
    cache = Path(tempfile.gettempdir()) / f"fleetspec-mypy-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"
    r = _tool("mypy", "--cache-dir", str(cache), "--no-error-summary", "--hide-error-context")
    if r.returncode:
        pytest.fail(f"mypy found problems:\n{r.stdout}{r.stderr}", pytrace=False)


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def long_modules(paths: list[Path], root: Path = ROOT, limit: int = MAX_MODULE_LINES) -> list[str]:
    """`path: N lines` for each file over `limit` lines."""
    out = []
    for path in paths:
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root)}: {n} lines")
    return out


def long_functions(paths: list[Path], root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`path:line name: N lines` for each function or method (nested ones too) over `limit` lines,
    counted from its `def` (decorators excluded) to its last line."""
    out = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {n} lines")
    return sorted(out)


def test_no_module_over_400_lines():
    offenders = long_modules(_modules())
    if offenders:
        pytest.fail(f"modules in fleetspec/ over {MAX_MODULE_LINES} lines:\n" + "\n".join(offenders), pytrace=False)


def test_no_function_over_60_lines():
    offenders = long_functions(_modules())
    if offenders:
        pytest.fail(f"functions in fleetspec/ over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders),
                    pytrace=False)


def test_shape_check_counts_what_it_says(tmp_path):
    """The counting itself, on files whose sizes are known: 60 lines pass, 61 do not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "ok.py").write_text(f"def fits():\n{body}\n")
    nested = body.replace("    x", "        x")
    (tmp_path / "big.py").write_text(f"class C:\n    @staticmethod\n    def over():\n{nested}\n        pass\n"
                                     + "\n" * 400)
    paths = sorted(tmp_path.glob("*.py"))
    assert long_functions(paths, tmp_path) == ["big.py:3 over: 61 lines"]
    assert long_modules(paths, tmp_path) == ["big.py: 463 lines"]

"""The code's habits, run by the test command: ruff and mypy as pyproject.toml configures them, the
shape asked of `fleetspec/` (no module over 400 lines, no function over 60), and no import cycle.

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


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, package: str = "fleetspec") -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports. Every import counts: at the top, inside a
    function, and under `if TYPE_CHECKING:` (a type-only import still ties the two modules' designs
    together, and moving it into a function is how a cycle hides). `from a import b` counts `a.b`
    when that is a module, else `a`. The lab engine, which runs on lab hosts, is left out."""
    modules = {_module_name(p, root): p for p in (root / package).rglob("*.py")
               if "__pycache__" not in p.parts and "engine" not in p.relative_to(root / package).parts[:2]}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join([*here[:len(here) - node.level + 1], node.module or ""] if node.level else
                                [node.module or ""]).strip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_fleetspec():
    found = cycles(import_graph(ROOT))
    if found:
        pytest.fail("import cycles in fleetspec/ (each line: modules that import each other, directly or "
                    "not):\n" + "\n".join(" ".join(c) for c in found), pytrace=False)


def test_the_cycle_check_sees_type_only_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (pkg / "c.py").write_text("import pkg.a\nx = 1\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.c", "pkg.sub.b"]]

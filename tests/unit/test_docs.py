"""The README is a front page and the manual builds: `mkdocs build --strict` (a broken link,
anchor, include or a page left out of the nav fails it), the README stays short, and neither the
README, the manual (as written and as built, includes and all) nor bench/RESULTS.md speaks of the
project's own process (work sessions, issues by number): they describe the project."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 160
PROCESS = re.compile(r"\b(?:session|issue)\s+\d+", re.IGNORECASE)
HTML_TAG = re.compile(r"<[^>]+>")


def mentions(text: str) -> list[str]:
    return [m.group(0) for m in PROCESS.finditer(text)]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material not installed (pip install -e '.[test]')")
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    if r.returncode:
        pytest.fail(f"mkdocs build --strict failed:\n{r.stdout}{r.stderr}", pytrace=False)
    return out


def test_the_manual_builds_strict_with_every_page(site):
    """Every page in docs/ is in the nav, the included files are really included, and the pages
    the other parts of the project own are there."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for x in node for p in pages(x)]
        return [p for v in node.values() for p in pages(v)]

    listed = set(pages(nav))
    written = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert written == listed, f"in docs/ but not in the nav: {written - listed}; in the nav only: {listed - written}"
    for page in ("security.md", "containers.md", "gpu.md", "ssh-access.md"):
        assert page in listed
    assert "Layers and who calls whom" in (site / "development.html").read_text()       # DEVELOPING.md
    assert "fleetspec beside Ansible" in (site / "bench-results.html").read_text()      # bench/RESULTS.md
    for img in re.findall(r"\]\((img/[^)]+\.png)\)", (REPO / "docs" / "performance.md").read_text()):
        assert (site / img).is_file(), img


def test_no_page_of_the_built_manual_speaks_of_sessions_or_issue_numbers(site):
    found = {p.relative_to(site).as_posix(): mentions(HTML_TAG.sub(" ", p.read_text()))
             for p in site.rglob("*.html")}
    assert not {k: v for k, v in found.items() if v}


def test_the_readme_is_a_front_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh", "mkdocs serve", "python3 bench/plots.py"):
        assert command in text, command
    for everyday in ("fleetspec deploy", "fleetspec rollback", "fleetspec status", "fleetspec history"):
        assert everyday in text, everyday
    assert "stand-in" in text
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()     # CI calls what the README names


def test_readme_manual_and_results_speak_of_the_project_only():
    files = [REPO / "README.md", REPO / "bench" / "RESULTS.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = {f.relative_to(REPO).as_posix(): mentions(f.read_text()) for f in files}
    assert not {k: v for k, v in found.items() if v}


def test_the_process_pattern_catches_what_it_must():
    assert mentions("Session 13 figures; see issue 17") == ["Session 13", "issue 17"]
    assert mentions("ISSUE  36 and session\n9") == ["ISSUE  36", "session\n9"]
    assert mentions("sglang issues #3506; the SSH session every 2 s") == []


# A fact stated on several pages, with the pattern that reads its figure. Each is stated with one
# current figure; git keeps the history. Whitespace (line breaks) is folded before matching.
FIGURES = {
    "cold set-up of the cache (s)": re.compile(r"cold set-up of /var/cache/fleetspec took (\d+) ?s"),
    "cold run of the whole suite (s)": re.compile(r"\ball (\d+) s \(\d+ min\b"),
    "cold run of the whole suite (min)": re.compile(r"\ball \d+ s \((\d+) min\b"),
    "one-host deploy (s)": re.compile(r"one-host deploy \| ([0-9.]+) s"),
    "a full cold run of the suite took": re.compile(r"cold set-up of (\d+) s, then \d+ tests"),
}


def figures_stated(pages: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """fact -> figure -> the pages that state it (pure)."""
    found: dict[str, dict[str, set[str]]] = {}
    for name, text in pages.items():
        flat = re.sub(r"\s+", " ", text)
        for fact, pattern in FIGURES.items():
            for m in pattern.finditer(flat):
                found.setdefault(fact, {}).setdefault(m.group(1), set()).add(name)
    return found


def _pages() -> dict[str, str]:
    paths = [REPO / "README.md", REPO / "DEVELOPING.md", REPO / "bench" / "RESULTS.md",
             REPO / "fleetspec" / "lab" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return {str(p.relative_to(REPO)): p.read_text() for p in paths if p.exists()}


def test_a_figure_stated_on_two_pages_is_the_same_figure():
    clashes = {fact: figs for fact, figs in figures_stated(_pages()).items() if len(figs) > 1}
    assert not clashes, f"one fact, several figures: {clashes}"


def test_the_figure_check_catches_two_pages_that_disagree():
    pages = {"README.md": "prepare: cold\nset-up of /var/cache/fleetspec took 253s",
             "docs/getting-started.md": "prepare: cold set-up of /var/cache/fleetspec took 373s"}
    assert figures_stated(pages)["cold set-up of the cache (s)"] == {"253": {"README.md"},
                                                                     "373": {"docs/getting-started.md"}}

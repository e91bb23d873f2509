"""The benches' figures as JSON under bench/results/ and as pictures: `python3 bench/plots.py`
renders every plot from the committed JSON, the bench scripts re-print their tables from it, and
every file says its date, its command and whether its figures are stand-in figures."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def need_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib not installed (pip install -e '.[test]')")


def test_every_result_names_its_date_command_and_stand_in():
    files = sorted(RESULTS.glob("*.json"))
    assert {"deploy-steps.json", "vs-ansible.json", "fleet-size.json"} <= {f.name for f in files}
    for f in files:
        meta = json.loads(f.read_text())["meta"]
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", meta["date"]), f
        assert meta["command"].startswith("python3 bench/") and f"--json bench/results/{f.name}" in meta["command"], f
        assert meta["stand_in"] is True, f                         # the lab's engine: never a GPU figure


def test_one_command_renders_every_plot_from_the_committed_json(tmp_path):
    need_matplotlib()
    r = run("bench/plots.py", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    from bench import plots

    for name in plots.PLOTS:
        png = tmp_path / f"{name}.png"
        if (RESULTS / f"{name}.json").is_file():
            assert png.read_bytes()[:8] == PNG and f"wrote {png}" in r.stdout
            assert (REPO / "docs" / "img" / f"{name}.png").is_file(), f"docs/img/{name}.png not committed"
            assert f"img/{name}.png" in (REPO / "docs" / "performance.md").read_text()
        else:
            assert not png.exists() and f"skipped {name}: no " in r.stdout


def test_the_rollout_under_load_plot_draws_from_what_its_bench_writes(tmp_path):
    """The schema bench/rollout_under_load.py writes (the committed run), alone in a results
    folder: that one picture is drawn and the others are skipped."""
    need_matplotlib()
    from bench import plots

    results = tmp_path / "results"
    results.mkdir()
    (results / "rollout-under-load.json").write_text((RESULTS / "rollout-under-load.json").read_text())
    written, skipped = plots.render(results, tmp_path / "img")
    assert written == [tmp_path / "img" / "rollout-under-load.png"]
    assert written[0].read_bytes()[:8] == PNG
    assert sorted(s.split(":")[0] for s in skipped) == ["deploy-steps", "fleet-size", "vs-ansible"]


def test_the_benches_reprint_their_tables_from_the_committed_json():
    """The manual quotes these tables; the JSON they come from re-prints them without a lab."""
    r = run("bench/vs_ansible.py", "--report", str(RESULTS / "vs-ansible.json"))
    assert r.returncode == 0, r.stderr
    assert "| rollback | 9.34 | 13.79 | 0.68 |" in r.stdout
    assert "of a release staged ahead 1.10 s, ratio 0.11" in r.stdout
    r = run("bench/fleet.py", "--report", str(RESULTS / "fleet-size.json"))
    assert r.returncode == 0, r.stderr
    assert "client CPU(N) = 0.08 + 0.122·N s" in r.stdout and "P* = (o1 - p)/q = 48 hosts" in r.stdout
    r = run("bench/fleet.py", "--report", str(RESULTS / "fleet-cpu-floor.json"))
    assert "| thin | 8 | first | 36.87 | 34.30 | 68.33 | 8.54 | 1.12 | 2 | 34.73 | 0.94 |" in r.stdout

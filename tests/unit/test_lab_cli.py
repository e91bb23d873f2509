"""`fleetspec lab` as a user sees it: not root is one clear line and exit 2; bad faults too."""

from click.testing import CliRunner

from fleetspec.cli import main


def test_lab_up_needs_root(monkeypatch, tmp_path):
    for d in ("inventory", "playbooks", "templates"):
        (tmp_path / d).mkdir()
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    result = CliRunner().invoke(main, ["--root", str(tmp_path), "lab", "up"])
    assert result.exit_code == 2
    assert "the lab needs root" in result.output
    assert "Traceback" not in result.output


def test_lab_fault_needs_a_kind(tmp_path):
    for d in ("inventory", "playbooks", "templates"):
        (tmp_path / d).mkdir()
    result = CliRunner().invoke(main, ["--root", str(tmp_path), "lab", "fault", "ct200"])
    assert result.exit_code == 2 and "KIND" in result.output

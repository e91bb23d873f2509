"""The systemd parser on output captured from the lab's real systemd 252."""

from __future__ import annotations

from pathlib import Path

from fleetspec.remote.facts import systemd

LAB = Path(__file__).resolve().parents[1] / "fixtures" / "systemd" / "252-lab"


def test_running_service():
    unit = systemd.parse((LAB / "show-ct200-active.txt").read_text(), service="sglang-qwen.service")
    assert (unit.load_state, unit.active_state, unit.sub_state) == ("loaded", "active", "running")
    assert unit.main_pid == 30 and unit.n_restarts == 0 and unit.result == "success"
    assert unit.fragment_path == "/etc/systemd/system/sglang-qwen.service" and unit.dropin_paths == []
    assert unit.environment == {"PYTHONUNBUFFERED": "1", "SGLANG_PLUGINS": ""}
    assert unit.argv[:3] == ["/opt/sglang/venv/bin/python3", "-m", "sglang.launch_server"]
    assert unit.argv[-2:] == ["--speculative-num-draft-tokens", "16"]
    assert "--speculative-algorithm" in unit.argv and unit.argv[unit.argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert unit.unit_file_state == "enabled"


def test_failed_transient_unit():
    unit = systemd.parse((LAB / "show-crashed.txt").read_text())
    assert (unit.active_state, unit.result) == ("failed", "exit-code")
    assert unit.exec_start[0].status == "3" and unit.exec_start[0].code == "exited"


def test_missing_unit():
    unit = systemd.parse((LAB / "show-not-found.txt").read_text())
    assert unit.load_state == "not-found" and unit.fragment_path in (None, "") and unit.dropin_paths == []

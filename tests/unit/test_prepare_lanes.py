"""`python -m fleetspec.lab.prepare` runs the image lane and the local lane side by side, after the
first lane, and a failure anywhere is one line and exit 2 (the runner is what is tested here; the
real stages run cold in CI's own first-contact run)."""

from __future__ import annotations

import threading
import time

import pytest

from fleetspec.errors import UserError
from fleetspec.lab import prepare


def test_the_two_lanes_overlap_and_a_warm_cache_prints_nothing(monkeypatch, capsys):
    both_running = threading.Barrier(2, timeout=10)   # each lane's step waits for the other's
    order = []

    def first():
        order.append("first")
        return False

    def meet(name):
        def step():
            assert order == ["first"], order
            both_running.wait()
            return False
        return step

    monkeypatch.setattr(prepare, "stages", lambda: [[("download", first)], [("rootfs", meet("image"))],
                                                    [("local env", meet("local"))]])
    assert prepare.main() == 0
    assert capsys.readouterr().out == ""


def test_a_failed_stage_is_one_line_and_exit_2(monkeypatch, capsys):
    def broken():
        raise UserError("debootstrap needs the Debian archive")

    monkeypatch.setattr(prepare, "stages", lambda: [[("download", lambda: True)], [("rootfs", broken)],
                                                    [("local env", lambda: True)]])
    assert prepare.main() == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == ["prepare: rootfs failed: debootstrap needs the Debian archive"]
    assert "prepare: local env" in captured.out and "cold set-up" not in captured.out


def test_the_first_lane_failing_starts_nothing_else(monkeypatch, capsys):
    ran = []

    def offline():
        raise UserError("no index")

    monkeypatch.setattr(prepare, "stages", lambda: [[("download", offline)], [("rootfs", lambda: ran.append(1))],
                                                    [("local env", lambda: ran.append(2))]])
    assert prepare.main() == 2 and ran == []
    assert capsys.readouterr().err.strip() == "prepare: download failed: no index"


@pytest.mark.timeout(60)
def test_a_layer_lane_waits_for_the_base_image_and_a_rootfs_failure_releases_it(monkeypatch, capsys):
    """A later version's layer lane starts once the image lane has the base image; when the image
    lane fails before it (debootstrap), the waiting lane fails in one line instead of hanging."""
    order = []

    def base():
        order.append("base")
        return True

    monkeypatch.setattr(prepare.image, "ensure_base", lambda log: base())
    monkeypatch.setattr(prepare.image, "marker", lambda folder: type("M", (), {"exists": lambda self: "base" in order})())
    lanes = lambda rootfs: [[("download", lambda: True)],
                            [("rootfs", rootfs), ("base image", prepare._base_then_open)],
                            [("base image (waited for)", prepare._wait_for_base),
                             ("layer sglang 0.5.23", lambda: order.append("layer") or True)]]
    monkeypatch.setattr(prepare, "stages", lambda: lanes(lambda: time.sleep(0.3) or True))
    assert prepare.main() == 0 and order == ["base", "layer"]

    def broken():
        raise UserError("debootstrap needs the Debian archive")

    order.clear()
    monkeypatch.setattr(prepare, "stages", lambda: lanes(broken))
    assert prepare.main() == 2 and order == []
    err = capsys.readouterr().err.strip().splitlines()
    assert "prepare: rootfs failed: debootstrap needs the Debian archive" in err

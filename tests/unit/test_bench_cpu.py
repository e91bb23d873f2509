"""bench/fleet.py's CPU floor reads the lab hosts' cgroups: the reader against this machine's own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.fleet import cgroup_cpu_seconds


def own_cgroups() -> list[Path]:
    """This process's cgroup folders with CPU accounting (v1 cpuacct, v2 cpu.stat)."""
    found = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        for mount in ([Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/cpu,cpuacct")] if "cpuacct" in controllers
                      else [Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")] if controllers == "" else []):
            folder = mount / rel.strip("/")
            if cgroup_cpu_seconds(folder) is not None:
                found.append(folder)
    return found


def test_a_cgroup_s_cpu_grows_by_what_its_processes_burn():
    folders = own_cgroups()
    if not folders:
        pytest.skip("no cgroup CPU accounting readable here")
    for folder in folders:
        before = cgroup_cpu_seconds(folder)
        t0 = time.process_time()
        while time.process_time() - t0 < 0.2:
            pass
        assert cgroup_cpu_seconds(folder) - before >= 0.15, folder


def test_a_folder_without_accounting_is_none(tmp_path):
    assert cgroup_cpu_seconds(tmp_path) is None
    (tmp_path / "cpu.stat").write_text("nr_periods 0\n")
    assert cgroup_cpu_seconds(tmp_path) is None
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    assert cgroup_cpu_seconds(tmp_path) == 2.5

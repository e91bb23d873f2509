"""The lab fleet for end-to-end tests: `lab up` for ct129 + ct200 (or FLEETSPEC_LAB_HOSTS) once per session.

`lab_fleet` yields a `LabFleet` (fleet root, inventory path, addresses, a `run(host, script)`
helper). It tears the lab down at session end unless FLEETSPEC_KEEP_LAB=1. Tests that need it
skip, saying why, when not root or when systemd-nspawn is missing.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The first host is like ct129 (sglang 0.5.13.post1, hybrid target, NEXTN), the second like ct200
# (0.5.23, DFLASH). Another checkout can run its own pair beside these (e.g. ct131,ct201).
LAB_HOSTS = tuple(os.environ.get("FLEETSPEC_LAB_HOSTS", "ct129,ct200").split(","))
# Thin hosts (fleetspec/lab/profiles.py: ct200's install and unit, an engine that imports nothing)
# for tests that need several hosts but no engine; tn1.. are bench/fleet.py's.
THIN_HOSTS = tuple(os.environ.get("FLEETSPEC_LAB_THIN_HOSTS", "tn61,tn62,tn63").split(","))


def _fleet_root() -> Path:
    """The fleet root the session's lab hosts belong to: the checkout, unless FLEETSPEC_LAB_ROOT
    names a folder for a second lab stream beside the first (scripts/test.sh runs two, on disjoint
    hosts). That folder becomes a fleet root of its own whose playbooks/ and templates/ are the
    checkout's, and whose inventory/lab.yaml and .lab/ssh are its own: neither stream's `--all`,
    keys or `lab down` reach the other's hosts."""
    named = os.environ.get("FLEETSPEC_LAB_ROOT")
    if not named:
        return ROOT
    path = Path(named).resolve()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for marker in ("playbooks", "templates"):
        if not (path / marker).is_symlink():
            (path / marker).symlink_to(ROOT / marker)
    (path / "inventory").mkdir(exist_ok=True)
    return path


FLEET_ROOT = _fleet_root()
# Every command these tests run acts on the lab's own inventory, named: a fleet root that also
# holds production.yaml would otherwise refuse a bare command (model/inventory.py).
os.environ["FLEETSPEC_INVENTORY"] = "lab"


def lab_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "lab tests need root (network namespaces, overlay mounts, systemd-nspawn)"
    for tool in ("systemd-nspawn", "ip", "unshare", "ssh"):
        if shutil.which(tool) is None:
            return f"lab tests need {tool} (apt-get install systemd-container iproute2 openssh-client)"
    return None


@dataclass
class LabFleet:
    root: Path
    inventory: Path
    addresses: dict[str, str]
    up_seconds: float
    hosts: tuple[str, ...] = LAB_HOSTS

    def run(self, host: str, script: str, timeout: float = 60):
        """Run a shell string on a lab host; returns CompletedProcess with bytes stdout/stderr."""
        from fleetspec.lab import ssh

        return ssh.run(self.root, self.addresses[host], script, timeout=timeout)


@pytest.fixture(scope="session")
def lab_fleet():
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    from fleetspec.lab import lab

    result = lab.up(FLEET_ROOT, LAB_HOSTS, log=lambda m: print(m, flush=True))
    fleet = LabFleet(FLEET_ROOT, result.inventory, dict(result.addresses), result.seconds)
    yield fleet
    if os.environ.get("FLEETSPEC_KEEP_LAB") != "1":
        lab.down(FLEET_ROOT)


@pytest.fixture(scope="module")
def thin_fleet():
    """THIN_HOSTS up for one test module, then down (only those: the session's hosts stay)."""
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    from fleetspec.lab import lab

    result = lab.up(FLEET_ROOT, THIN_HOSTS, log=lambda m: print(m, flush=True))
    fleet = LabFleet(FLEET_ROOT, result.inventory, dict(result.addresses), result.seconds, THIN_HOSTS)
    yield fleet
    if os.environ.get("FLEETSPEC_KEEP_LAB") != "1":
        lab.down(FLEET_ROOT, only=THIN_HOSTS)


def pytest_collection_modifyitems(session, config, items):
    """First-contact tests first (an engine still loading, one stopped: the session's first boot),
    and the one marked `last` last: it takes the lab down and brings it up from cold."""
    items.sort(key=lambda item: 2 if item.get_closest_marker("last") else
               0 if item.get_closest_marker("first_contact") else 1)


def pytest_terminal_summary(terminalreporter):
    """The reliability suite's counts (faults injected, cases tried), when it ran."""
    import sys

    rel = sys.modules.get("tests.lab.reliability_lab")
    if rel is None or not rel.COUNTS:
        return
    terminalreporter.section("reliability counts")
    for what, n in sorted(rel.COUNTS.items()):
        terminalreporter.write_line(f"{n:6d}  {what}")
    terminalreporter.write_line(f"{sum(n for w, n in rel.COUNTS.items() if w.startswith('faults')):6d}  faults injected in all")

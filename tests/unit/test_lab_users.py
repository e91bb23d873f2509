"""`lab up`'s extra users (fleetspec.lab.hosts.add_users), laid over a lower layer as a host sees it:
passwd/shadow/group keep their lines, modes and owners; each user's key is theirs alone; the sudoers
file is 0440 and gives only `ops` passwordless sudo. (tests/lab/test_sudo_access.py logs in as them.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fleetspec.lab import hosts


@pytest.fixture
def lower(tmp_path) -> Path:
    root = tmp_path / "lower"
    (root / "etc").mkdir(parents=True)
    (root / "home").mkdir()
    for name in ("passwd", "shadow", "group"):
        shutil.copy2(f"/etc/{name}", root / "etc" / name)
    return root


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_users_keys_and_sudoers(tmp_path, lower):
    upper = tmp_path / "upper"
    upper.mkdir()
    hosts.add_users(upper, [lower], b"ssh-ed25519 AAAAkey lab\n")
    for name in ("passwd", "shadow", "group"):
        before, after = (lower / "etc" / name), (upper / "etc" / name)
        assert after.read_bytes().startswith(before.read_bytes())
        assert (after.stat().st_mode, after.stat().st_gid) == (before.stat().st_mode, before.stat().st_gid)
    passwd = (upper / "etc/passwd").read_text()
    for user, (uid, _) in hosts.LAB_USERS.items():
        assert f"{user}:x:{uid}:{uid}::/home/{user}:/bin/bash\n" in passwd
        key = upper / f"home/{user}/.ssh/authorized_keys"
        assert key.read_bytes() == b"ssh-ed25519 AAAAkey lab\n"
        for path, mode in ((key, 0o600), (key.parent, 0o700), (key.parent.parent, 0o700)):
            st = path.stat()
            assert (st.st_uid, st.st_mode & 0o777) == (uid, mode), path
    shadow = (upper / "etc/shadow").read_text()
    assert all(f"\n{user}:*:" in shadow for user in hosts.LAB_USERS)      # no password works; `!` would lock
    sudoers = upper / "etc/sudoers.d/fleetspec-lab"
    assert sudoers.stat().st_mode & 0o777 == 0o440
    assert sudoers.read_text() == "ops ALL=(ALL:ALL) NOPASSWD: ALL\npwsudo ALL=(ALL:ALL) ALL\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_second_lab_up_adds_no_duplicate_lines(tmp_path, lower):
    upper = tmp_path / "upper"
    upper.mkdir()
    hosts.add_users(upper, [lower], b"k\n")
    hosts.add_users(upper, [upper, lower], b"k\n")
    assert (upper / "etc/passwd").read_text().count("\nops:") == 1

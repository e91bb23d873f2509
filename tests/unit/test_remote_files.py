"""The atomic file builders and the session-bound lock, run for real by a local shell."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetspec.remote import files
from fleetspec.remote.lock import BUSY, acquire_script
from fleetspec.remote.lock_holder import Holder


def bash(script: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, **kw)


def test_symlink_flip_is_a_rename(tmp_path):
    a, b, link = tmp_path / "a", tmp_path / "b", tmp_path / "current"
    a.mkdir(), b.mkdir()
    assert bash(files.symlink_atomic(str(a), str(link))).returncode == 0
    assert os.readlink(link) == str(a)
    assert bash(files.symlink_atomic(str(b), str(link))).returncode == 0
    assert os.readlink(link) == str(b) and not (tmp_path / ("current" + files.TMP_SUFFIX)).exists()


def test_copy_atomic_checks_the_hash_before_replacing(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_bytes(b"new"), dest.write_bytes(b"old")
    wrong = bash(files.copy_atomic(str(src), str(dest), "0" * 64))
    assert wrong.returncode != 0 and dest.read_bytes() == b"old"
    right = bash(files.copy_atomic(str(src), str(dest), hashlib.sha256(b"new").hexdigest()))
    assert right.returncode == 0 and dest.read_bytes() == b"new"


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="\n\x00", blacklist_categories=("Cs",)), max_size=80))
def test_append_line_writes_any_text_verbatim(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("ledger") / "ledger.jsonl"
    assert bash(files.append_line(str(path), text)).returncode == 0
    assert path.read_bytes() == (text + "\n").encode()


def test_sha256_of_lists_only_existing_files(tmp_path):
    (tmp_path / "x").write_bytes(b"x")
    out = bash(files.sha256_of([str(tmp_path / "x"), str(tmp_path / "missing")])).stdout
    assert files.parse_sha256sum(out) == {str(tmp_path / "x"): hashlib.sha256(b"x").hexdigest()}


def test_lock_is_exclusive_names_its_holder_and_frees_when_the_holder_goes(tmp_path):
    lock = str(tmp_path / "svc" / "lock")
    holder = Holder(who="alice", machine="m1", pid=4242, since=1.0, release="r1", controller="c1", token="t1")
    other = Holder(who="bob", machine="m2", pid=4343, since=2.0, release="r2", controller="c2", token="t2")
    first = subprocess.Popen(["bash", "-c", acquire_script(lock, holder)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        line = first.stdout.readline()
        assert line.startswith("LOCKED")
        record = json.loads((tmp_path / "svc" / "lock.holder").read_text())
        assert record["who"] == "alice" and record["remote_pid"] == int(line.split()[1])
        second = bash(acquire_script(lock, other), stdin=subprocess.DEVNULL)
        assert second.returncode == BUSY
    finally:
        first.stdin.close()          # the session ends: cat sees EOF, flock lets go
        first.wait(timeout=10)
    third = bash(acquire_script(lock, other), stdin=subprocess.DEVNULL)
    assert third.returncode == 0 and third.stdout.startswith("LOCKED")
    assert json.loads((tmp_path / "svc" / "lock.holder").read_text())["who"] == "bob"

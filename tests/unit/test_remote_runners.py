"""remote.files and remote.release_files run over a real SSH transport (loopback sshd): what ops/
calls instead of building shell, each proved on real files."""

from __future__ import annotations

import hashlib
import os

import pytest

from fleetspec.errors import RemoteError
from fleetspec.remote import files


def test_sha256_map_lists_existing_files_only(t, tmp_path):
    (tmp_path / "a b").write_bytes(b"x")
    got = files.sha256_map(t, [str(tmp_path / "a b"), str(tmp_path / "missing")])
    assert got == {str(tmp_path / "a b"): hashlib.sha256(b"x").hexdigest()}
    assert files.sha256_map(t, []) == {}


def test_read_text_readlink_is_file_and_missing_paths(t, tmp_path):
    (tmp_path / "f").write_text("hello\n")
    os.symlink(str(tmp_path / "f"), tmp_path / "link")
    assert files.read_text(t, str(tmp_path / "f")) == "hello\n"
    assert files.read_text(t, str(tmp_path / "nope")) is None
    assert files.readlink(t, str(tmp_path / "link")) == str(tmp_path / "f")
    assert files.readlink(t, str(tmp_path / "f")) == ""
    assert files.is_file(t, str(tmp_path / "f")) and not files.is_file(t, str(tmp_path / "nope"))
    assert files.missing_paths(t, [str(tmp_path / "f"), str(tmp_path / "it's gone")]) == [str(tmp_path / "it's gone")]


def test_file_modes_and_private_line_append(t, tmp_path):
    (tmp_path / "m").write_bytes(b"")
    os.chmod(tmp_path / "m", 0o640)
    assert files.file_modes(t, [str(tmp_path / "m"), str(tmp_path / "nope")]) == {str(tmp_path / "m"): 0o640}
    folder = tmp_path / "state"
    r = files.append_private_lines(t, str(folder), str(folder / "ledger.jsonl"), ["one"])
    assert r.ok and (folder / "ledger.jsonl").read_text() == "one\n" and (os.stat(folder).st_mode & 0o777) == 0o700
    refused = files.append_private_lines(t, str(folder), str(folder / "ledger.jsonl"), ["two"], guard="exit 9")
    assert refused.rc == 9 and (folder / "ledger.jsonl").read_text() == "one\n"   # the guard's failure is the caller's


def test_rename_into_place_new_and_replace(t, tmp_path):
    final = tmp_path / "base" / "baseline"
    files.fresh_private_tree(t, str(tmp_path / "base"), str(final) + ".tmp", ("dropins",))
    (tmp_path / "base" / "baseline.tmp" / "v").write_text("1")
    files.rename_into_place(t, str(final) + ".tmp", str(final), replace=False)
    assert (final / "v").read_text() == "1" and (final / "dropins").is_dir()
    files.fresh_private_tree(t, str(tmp_path / "base"), str(final) + ".tmp")
    (tmp_path / "base" / "baseline.tmp" / "v").write_text("2")
    with pytest.raises(RemoteError, match="exited 1"):     # never over an existing one unless asked
        files.rename_into_place(t, str(final) + ".tmp", str(final), replace=False)
    files.rename_into_place(t, str(final) + ".tmp", str(final), replace=True)
    assert (final / "v").read_text() == "2" and not (tmp_path / "base" / "baseline.old").exists()


def test_rm_tree(t, tmp_path):
    final = tmp_path / "rel"
    (final / "patch" / "pkg").mkdir(parents=True)
    (final / "patch" / "pkg" / "mod.py").write_bytes(b"payload")
    files.rm_tree(t, str(final))
    assert not final.exists()


def test_run_python_starts_in_the_private_run_folder(t, tmp_path):
    import sys

    rundir = str(tmp_path / "run")
    r = files.run_python(t, sys.executable, "import os,sys; print(os.getcwd(), sys.argv[1])", ["x y"], rundir=rundir,
                         timeout=60)
    assert r.ok and r.stdout.strip() == f"{rundir} x y"
    scratch = files.make_scratch(t, rundir)
    assert scratch.startswith(rundir + "/scratch.") and os.path.isdir(scratch)

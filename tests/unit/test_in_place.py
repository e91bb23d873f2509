"""In-place mode's file scripts, run by a real shell against a scratch site-packages:
apply backs up with hashes and replaces; undo restores byte-exact and removes what was added."""

from __future__ import annotations

import hashlib
import subprocess

from fleetspec.model.release import Release
from fleetspec.remote.release_files import in_place_apply_script, in_place_undo_script


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def setup(tmp_path):
    site, rdir = tmp_path / "site", tmp_path / "release"
    (site / "sglang/srt/speculative/__pycache__").mkdir(parents=True)
    (site / "sglang/srt/speculative/spec_info.py").write_bytes(b"BASE = 1\n")
    (site / "sglang/srt/speculative/__pycache__/spec_info.cpython-311.pyc").write_bytes(b"stale")
    (rdir / "patch/sglang/srt/speculative").mkdir(parents=True)
    new, added = b"BASE = 2  # patched\n", b"def build(): ...\n"
    (rdir / "patch/sglang/srt/speculative/spec_info.py").write_bytes(new)
    (rdir / "patch/sglang/srt/speculative/ddtree_utils.py").write_bytes(added)
    release = Release(id="r1", host="h", service="s.service", algo="ddtree", mode="in-place", sglang_version="x",
                      argv=[], previous="baseline", site_packages=str(site),
                      files={"sglang/srt/speculative/spec_info.py": sha(new),
                             "sglang/srt/speculative/ddtree_utils.py": sha(added)},
                      base_files={"sglang/srt/speculative/spec_info.py": sha(b"BASE = 1\n"),
                                  "sglang/srt/speculative/ddtree_utils.py": None})
    return site, rdir, release


def sh(script):
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def test_apply_then_undo_is_byte_exact(tmp_path):
    site, rdir, release = setup(tmp_path)
    before = tree(site)
    assert sh(in_place_apply_script(release, str(rdir))).returncode == 0
    after = tree(site)
    assert after["sglang/srt/speculative/spec_info.py"] == b"BASE = 2  # patched\n"
    assert "sglang/srt/speculative/ddtree_utils.py" in after
    assert not any(k.endswith(".pyc") for k in after)            # stale bytecode can't shadow the patch
    assert (rdir / "backup/sglang/srt/speculative/spec_info.py").read_bytes() == b"BASE = 1\n"
    assert sh(in_place_undo_script(release, str(rdir))).returncode == 0
    restored = tree(site)
    assert restored == {k: v for k, v in before.items() if not k.endswith(".pyc")}


def test_apply_refuses_a_drifted_base_and_changes_nothing(tmp_path):
    site, rdir, release = setup(tmp_path)
    (site / "sglang/srt/speculative/spec_info.py").write_bytes(b"EDITED BY HAND\n")
    before = tree(site)
    r = sh(in_place_apply_script(release, str(rdir)))
    assert r.returncode != 0
    assert tree(site) == before


def test_reapply_keeps_the_first_backup(tmp_path):
    site, rdir, release = setup(tmp_path)
    assert sh(in_place_apply_script(release, str(rdir))).returncode == 0
    assert sh(in_place_apply_script(release, str(rdir))).returncode == 0     # e.g. rollback --to this release
    assert (rdir / "backup/sglang/srt/speculative/spec_info.py").read_bytes() == b"BASE = 1\n"

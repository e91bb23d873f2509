"""The overlay script, run for real with bash on a small fake site-packages."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from fleetspec.build.patchset import load_patchset
from fleetspec.remote.overlay import overlay_script


def _patchset(root: Path, files: dict[str, bytes], base: dict[str, bytes]) -> Path:
    entries = []
    for rel, data in files.items():
        (root / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "files" / rel).write_bytes(data)
        entry = {"path": rel, "action": "add", "sha256": hashlib.sha256(data).hexdigest()}
        if rel in base:
            entry.update(action="replace", base_sha256=hashlib.sha256(base[rel]).hexdigest())
        entries.append(entry)
    (root / "manifest.json").write_text(json.dumps({
        "package": "pkg", "version": "1.0", "files": entries,
        "extra_top_level": ["plug", "plug-1.0.dist-info"]}))
    return root


@pytest.fixture
def world(tmp_path):
    site = tmp_path / "site"
    base = {"pkg/a.py": b"A = 'base'\n", "pkg/sub/b.py": b"B = 'base'\n"}
    for rel, data in base.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    (site / "pkg/__init__.py").write_text("")
    (site / "pkg/__pycache__").mkdir()
    (site / "pkg/__pycache__/a.cpython-311.pyc").write_bytes(b"stale")
    (site / "pkg/__pycache__/keep.cpython-311.pyc").write_bytes(b"ok")
    ps_dir = _patchset(tmp_path / "ps", {
        "pkg/a.py": b"A = 'patched'\n",
        "pkg/new/c.py": b"C = 1\n",
        "plug/__init__.py": b"",
        "plug-1.0.dist-info/entry_points.txt": b"[g]\nx = plug:f\n",
    }, base)
    return site, load_patchset(ps_dir), tmp_path / "release/overlay"


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_overlay_is_a_symlink_farm_with_real_patched_files(world):
    site, ps, dest = world
    r = _run(overlay_script(str(site), str(ps.files_dir), str(dest), ps))
    assert r.returncode == 0, r.stderr
    # Only the folders on the way to a patched file are real; the rest is one link each.
    assert (dest / "pkg/sub").is_symlink() and os.readlink(dest / "pkg/sub") == str(site / "pkg/sub")
    assert (dest / "pkg/__init__.py").is_symlink() and os.readlink(dest / "pkg/__init__.py") == str(site / "pkg/__init__.py")
    assert sorted(os.listdir(dest / "pkg")) == ["__init__.py", "__pycache__", "a.py", "new", "sub"]
    for rel in ("pkg/a.py", "pkg/new/c.py", "plug/__init__.py", "plug-1.0.dist-info/entry_points.txt"):
        assert (dest / rel).is_file() and not (dest / rel).is_symlink()
    assert (dest / "pkg/a.py").read_text() == "A = 'patched'\n"
    assert (site / "pkg/a.py").read_text() == "A = 'base'\n"  # the live install is untouched
    assert not (dest / "pkg/__pycache__/a.cpython-311.pyc").exists()
    assert (dest / "pkg/__pycache__/keep.cpython-311.pyc").is_symlink()
    out = subprocess.run(["python3", "-c", "import pkg.a, pkg.sub.b; print(pkg.a.A, pkg.sub.b.B)"],
                         env={"PYTHONPATH": str(dest), "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, cwd="/")
    assert out.stdout.split() == ["patched", "base"]
    # The patched module's bytecode went into the release, never into the live install.
    assert sorted(os.listdir(site / "pkg/__pycache__")) == ["a.cpython-311.pyc", "keep.cpython-311.pyc"]
    assert (site / "pkg/__pycache__/a.cpython-311.pyc").read_bytes() == b"stale"
    assert any(n.startswith("a.") and not (dest / "pkg/__pycache__" / n).is_symlink()
               for n in os.listdir(dest / "pkg/__pycache__"))


def test_rebuilding_replaces_the_previous_overlay(world):
    site, ps, dest = world
    assert _run(overlay_script(str(site), str(ps.files_dir), str(dest), ps)).returncode == 0
    (dest / "pkg/leftover.py").write_text("")
    assert _run(overlay_script(str(site), str(ps.files_dir), str(dest), ps)).returncode == 0
    assert not (dest / "pkg/leftover.py").exists()


def test_a_corrupted_upload_fails_and_leaves_no_overlay(world):
    site, ps, dest = world
    (ps.files_dir / "pkg/a.py").write_bytes(b"A = 'corrupted'\n")
    r = _run(overlay_script(str(site), str(ps.files_dir), str(dest), ps))
    assert r.returncode != 0 and "pkg/a.py" in r.stdout + r.stderr
    assert not dest.exists()


def test_extra_files_are_copied_in(world, tmp_path):
    site, ps, dest = world
    so = tmp_path / "tree_mask.so"
    so.write_bytes(b"\x7fELF")
    script = overlay_script(str(site), str(ps.files_dir), str(dest), ps,
                            extra={"fleetspec_kernels/tree_mask.so": str(so)})
    assert _run(script).returncode == 0
    assert (dest / "fleetspec_kernels/tree_mask.so").read_bytes() == b"\x7fELF"


def test_every_path_is_quoted(tmp_path):
    site, ps_dir = tmp_path / "si te", tmp_path / "p s"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg/a.py").write_text("")
    ps = load_patchset(_patchset(ps_dir, {"pkg/x.py": b"1"}, {}))
    dest = tmp_path / "de st; rm -rf x"
    assert _run(overlay_script(str(site), str(ps.files_dir), str(dest), ps)).returncode == 0
    assert (dest / "pkg/x.py").is_file()

"""Patch sets generated from diffs: the shipped ones equal the copies they replaced, byte for byte;
a hunk that does not match, a base that is not its RECORD's, and the build cache, on small real
wheels (zip + RECORD) and diffs made by GNU diff."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetspec.build import patchset as B
from fleetspec.cli import main
from fleetspec.errors import ConfigError, UserError
from fleetspec.model import patchset as P
from fleetspec.model import unidiff

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "playbooks/ddtree/patches"
PAYLOAD = REPO / "playbooks/ddtree/payload"
EXPECTED = REPO / "tests/fixtures/patchset_expected"
VERSIONS = ("0.5.13.post1", "0.5.23")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _need_wheel(version: str) -> None:
    if P.find_wheel("sglang", version) is None:
        msg = f"sglang {version} wheel not cached in {P.WHEEL_CACHE} (python3 -m fleetspec.lab.prepare)"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)


@pytest.mark.parametrize("version", VERSIONS)
def test_build_reproduces_the_copied_patch_sets_byte_for_byte(version, tmp_path):
    """Against the sha256s captured from the copies before they were removed. A payload file edited
    since then (it is built from payload/ now) is expected at its new hash, in files/ and manifest."""
    _need_wheel(version)
    expected = json.loads((EXPECTED / f"{version}.json").read_text())
    folder = PATCHES / f"sglang-{version}"
    from_payload = {dest: src for dest, src in B.load_recipe(folder).adds if PAYLOAD in src.resolve().parents}
    assert len(from_payload) == 2
    want_files = dict(expected["files"]) | {d: _sha(s.read_bytes()) for d, s in from_payload.items()}
    want_manifest = expected["manifest"]
    for entry in want_manifest["files"]:
        entry["sha256"] = want_files[entry["path"]]

    ps = B.build(folder, cache=tmp_path).patchset
    got = {p.relative_to(ps.files_dir).as_posix(): _sha(p.read_bytes())
           for p in ps.files_dir.rglob("*") if p.is_file()}
    assert got == want_files
    assert ps.manifest_path.read_bytes() == (json.dumps(want_manifest, indent=2) + "\n").encode()
    if want_files == expected["files"]:
        assert _sha(ps.manifest_path.read_bytes()) == expected["manifest_sha256"]


def test_no_copied_sglang_file_is_left_in_the_playbook():
    """Every .py under playbooks/ddtree is payload, plugin or a file sglang does not have."""
    _need_wheel("0.5.13.post1")
    _need_wheel("0.5.23")
    names = set()
    for version in VERSIONS:
        names |= {p.rsplit("/", 1)[-1] for p in P.read_record(P.find_wheel("sglang", version))}
    ours = [p for p in (REPO / "playbooks/ddtree").rglob("*.py") if "kernels" not in p.parts]
    assert ours and not [p for p in ours if p.name in names and p.name != "__init__.py"]


# --- a small real wheel and real diffs -----------------------------------------------------------

BASE = {
    "sglang/__init__.py": b"",
    "sglang/srt/args.py": b"".join(b"line %d\n" % i for i in range(1, 41)),
    "sglang/srt/tail.py": b"a = 1\nb = 2",          # no newline at the end
}


def _wheel(folder: Path, files: dict[str, bytes], *, lie: dict[str, bytes] | None = None) -> Path:
    """sglang 9.9.9 as a wheel; `lie` puts other bytes in the zip than RECORD hashes."""
    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "sglang-9.9.9-py3-none-any.whl"
    record = "".join(f"{p},sha256={digest(d)},{len(d)}\n" for p, d in files.items())
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, (lie or {}).get(path, data))
        zf.writestr("sglang-9.9.9.dist-info/RECORD", record + "sglang-9.9.9.dist-info/RECORD,,\n")
    return wheel


def _diff(tmp: Path, path: str, old: bytes, new: bytes) -> bytes:
    if shutil.which("diff") is None:
        pytest.skip("GNU diff not installed")
    (tmp / "a").write_bytes(old)
    (tmp / "b").write_bytes(new)
    done = subprocess.run(["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}", str(tmp / "a"),
                           str(tmp / "b")], capture_output=True)
    assert done.returncode == 1, done.stderr
    return done.stdout


def _edit_args(data: bytes) -> bytes:
    return data.replace(b"line 5\n", b"line five\n").replace(b"line 30\n", b"line 30\nadded\n")


@pytest.fixture
def setup(tmp_path):
    """(patches folder, wheels folder, cache folder) for sglang 9.9.9: two diffs, a payload, a folder."""
    wheels = tmp_path / "wheels"
    _wheel(wheels, BASE)
    play = tmp_path / "playbooks/algo"
    folder = play / "patches/sglang-9.9.9"
    folder.mkdir(parents=True)
    (folder / "args.diff").write_bytes(_diff(tmp_path, "sglang/srt/args.py", BASE["sglang/srt/args.py"],
                                             _edit_args(BASE["sglang/srt/args.py"])))
    (folder / "tail.diff").write_bytes(_diff(tmp_path, "sglang/srt/tail.py", BASE["sglang/srt/tail.py"],
                                             b"a = 1\nb = 3"))
    (folder / "series").write_text("# order matters\nargs.diff\ntail.diff\n")
    (play / "payload").mkdir()
    (play / "payload/util.py").write_text("X = 1\n")
    (play / "plugin/sglang_plugin").mkdir(parents=True)
    (play / "plugin/sglang_plugin/__init__.py").write_text("")
    (play / "plugin/sglang_plugin/__pycache__").mkdir()
    (play / "plugin/sglang_plugin/__pycache__/x.pyc").write_bytes(b"junk")
    (folder / "add").write_text("sglang/srt/util.py ../../payload/util.py\n"
                                "sglang_plugin/ ../../plugin/sglang_plugin/\n")
    return folder, wheels, tmp_path / "cache"


def test_build_applies_diffs_to_the_wheel_and_lays_files_in(setup):
    folder, wheels, cache = setup
    done = B.build(folder, wheels, cache)
    ps = done.patchset
    assert done.built and ps.root == cache / done.inputs / "sglang-9.9.9"
    by_path = {f.path: f for f in ps.files}
    assert set(by_path) == {"sglang/srt/args.py", "sglang/srt/tail.py", "sglang/srt/util.py",
                            "sglang_plugin/__init__.py"}
    assert ps.source(by_path["sglang/srt/args.py"]).read_bytes() == _edit_args(BASE["sglang/srt/args.py"])
    assert ps.source(by_path["sglang/srt/tail.py"]).read_bytes() == b"a = 1\nb = 3"
    assert by_path["sglang/srt/args.py"].base_sha256 == _sha(BASE["sglang/srt/args.py"])
    assert by_path["sglang/srt/util.py"].action == "add" and ps.extra_top_level == ("sglang_plugin",)
    P.verify_patchset(ps, wheels)


def test_second_build_reuses_the_cache_and_an_input_change_rebuilds(setup):
    folder, wheels, cache = setup
    first = B.build(folder, wheels, cache)
    stamp = first.patchset.manifest_path.stat().st_mtime_ns
    again = B.build(folder, wheels, cache)
    assert not again.built and again.inputs == first.inputs
    assert again.patchset.manifest_path.stat().st_mtime_ns == stamp
    diff = folder / "args.diff"
    diff.write_bytes(diff.read_bytes().replace(b"+line five\n", b"+line FIVE\n"))
    changed = B.build(folder, wheels, cache)
    assert changed.built and changed.inputs != first.inputs
    args = next(f for f in changed.patchset.files if f.path == "sglang/srt/args.py")
    assert b"line FIVE\n" in changed.patchset.source(args).read_bytes()
    (folder.parents[1] / "payload/util.py").write_text("X = 2\n")
    assert B.build(folder, wheels, cache).built
    assert sorted(p.name for p in cache.iterdir()) == sorted({first.inputs, changed.inputs, B.build(
        folder, wheels, cache).inputs})


def test_the_wheels_hash_is_remembered_beside_it_until_the_wheel_is_written_again(tmp_path):
    """wheel_sha256 (the build cache's key) hashes a wheel once; a wheel written again (another
    size or mtime) is hashed again, and a folder that cannot take the note still gets the hash."""
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"first wheel")
    assert B.wheel_sha256(wheel) == hashlib.sha256(b"first wheel").hexdigest()
    note = tmp_path / ".pkg-1.0-py3-none-any.whl.sha256"
    kept = json.loads(note.read_text())
    note.write_text(json.dumps({**kept, "sha256": "remembered"}))
    assert B.wheel_sha256(wheel) == "remembered"           # read from the note, not hashed again
    wheel.write_bytes(b"a wheel built again")
    assert B.wheel_sha256(wheel) == hashlib.sha256(b"a wheel built again").hexdigest()
    st = wheel.stat()
    wheel.write_bytes(b"a wheel built AGAIN")               # same size and inode, mtime 1 ns later
    os.utime(wheel, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert B.wheel_sha256(wheel) == hashlib.sha256(b"a wheel built AGAIN").hexdigest()
    note.unlink()
    note.mkdir()                                            # no note can be written here
    assert B.wheel_sha256(wheel) == hashlib.sha256(b"a wheel built AGAIN").hexdigest()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_load_patchset_builds_a_patches_folder_transparently(setup, monkeypatch):
    folder, wheels, cache = setup
    monkeypatch.setattr(P, "WHEEL_CACHE", wheels)
    monkeypatch.setattr(B, "PATCHSET_CACHE", cache)
    ps = B.load_patchset(folder)
    assert ps.root.name == "sglang-9.9.9" and ps.root.parent.parent == cache and ps.version == "9.9.9"


def test_a_hunk_that_does_not_match_fails_naming_the_diff_and_hunk(setup):
    folder, wheels, cache = setup
    diff = folder / "args.diff"
    diff.write_bytes(diff.read_bytes().replace(b" line 29\n", b" line 29 (edited upstream)\n"))
    with pytest.raises(ConfigError) as err:
        B.build(folder, wheels, cache)
    msg = str(err.value)
    assert msg.startswith(f"{diff}: sglang/srt/args.py hunk 2 (@@ -28,6 +28,7 @@)") and "\n" not in msg
    assert "line 29 of the base is 'line 29', the hunk expects 'line 29 (edited upstream)'" in msg
    assert not cache.exists() or not any(cache.rglob("manifest.json"))


def test_a_hunk_moved_by_an_offset_is_refused_too(setup):
    """Zero fuzz includes no offset: the base is pinned by its hash, so line numbers are exact."""
    folder, wheels, cache = setup
    diff = folder / "args.diff"
    diff.write_bytes(diff.read_bytes().replace(b"@@ -28,6 +28,7 @@", b"@@ -29,6 +29,7 @@"))
    with pytest.raises(ConfigError, match=r"hunk 2 \(@@ -29,6 \+29,7 @@\): does not apply with zero fuzz"):
        B.build(folder, wheels, cache)


def test_cli_build_reports_a_bad_hunk_in_one_line_with_exit_2(setup):
    folder, wheels, cache = setup
    root = folder.parents[3]
    for sub in ("inventory", "templates"):
        (root / sub).mkdir()
    args = ["--root", str(root), "patchset", "build", "--wheels", str(wheels), "--cache", str(cache)]
    out = CliRunner().invoke(main, args + ["--version", "9.9.9"])
    assert out.exit_code == 0 and "built in" in out.output and "1 replaced" not in out.output, out.output
    assert "(sglang==9.9.9, 2 replaced, 2 added)" in out.output
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0 and ": cached: " in out.output
    (folder / "tail.diff").write_bytes((folder / "tail.diff").read_bytes().replace(b"-b = 2", b"-b = 4"))
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1, out.output
    assert "tail.diff: sglang/srt/tail.py hunk 1" in out.output and "Traceback" not in out.output
    out = CliRunner().invoke(main, args + ["--version", "1.0"])
    assert out.exit_code == 2 and "no patches folders" in out.output


def test_a_base_file_that_differs_from_its_record_is_refused(setup):
    folder, wheels, cache = setup
    _wheel(wheels, BASE, lie={"sglang/srt/tail.py": b"a = 1\nb = 2\nimport os\n"})
    with pytest.raises(UserError, match=r"sglang/srt/tail.py hashes to [0-9a-f]{64}, but the wheel's RECORD "
                                        r"says [0-9a-f]{64}; refusing a base that is not sglang==9.9.9"):
        B.build(folder, wheels, cache)


def test_a_diff_for_a_file_the_wheel_lacks_and_a_missing_wheel_are_refused(setup, tmp_path):
    folder, wheels, cache = setup
    (folder / "x.diff").write_bytes(b"--- a/sglang/nope.py\n+++ b/sglang/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    (folder / "series").write_text("x.diff\n")
    with pytest.raises(ConfigError, match=r"x.diff: sglang/nope.py: a file of sglang==9.9.9"):
        B.build(folder, wheels, cache)
    with pytest.raises(UserError, match=r"no wheel for sglang==9.9.9 in .*empty"):
        B.build(folder, tmp_path / "empty", cache)


@pytest.mark.parametrize("series, add, expected", [
    ("../args.diff\n", "", r"series: line 1: the name of a diff file"),
    ("gone.diff\n", "", r"series: line 1: the name of a diff file"),
    ("args.diff\n", "sglang/x.py\n", r"add: line 1: '<path in site-packages> <source>'"),
    ("args.diff\n", "sglang/x.py nothere.py\n", r"add: line 1: a file at nothere.py"),
    ("args.diff\n", "sglang/x/ ../../payload/util.py\n", r"add: line 1: relative paths, both ending in /"),
    ("args.diff\n", "sglang/srt/args.py ../../payload/util.py\n", r"sglang/srt/args.py: a path no diff changes"),
])
def test_bad_series_and_add_lines_are_refused_naming_file_and_line(setup, series, add, expected):
    folder, wheels, cache = setup
    (folder / "series").write_text(series)
    (folder / "add").write_text(add)
    with pytest.raises(ConfigError, match=expected):
        B.build(folder, wheels, cache)


def test_new_file_diffs_are_refused_with_where_they_belong():
    with pytest.raises(ConfigError, match="new files go in the patch folder's `add` list"):
        unidiff.parse(b"--- /dev/null\n+++ b/sglang/new.py\n@@ -0,0 +1 @@\n+x\n", "new.diff")
    with pytest.raises(ConfigError, match=r"hunk 1 \(@@ -1,2 \+1,2 @@\): 2 old and 2 new lines, got 1 and 1"):
        unidiff.parse(b"--- a/s/x.py\n+++ b/s/x.py\n@@ -1,2 +1,2 @@\n-a\n+b\n", "short.diff")

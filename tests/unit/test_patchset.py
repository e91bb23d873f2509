"""Patch-set manifests: validation, build against the real wheel's RECORD, base checks, selection."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetspec.build import patchset as B
from fleetspec.cli import main
from fleetspec.errors import ConfigError, UserError
from fleetspec.model import patchset as P

REPO = Path(__file__).resolve().parents[2]
PATCHSETS = REPO / "playbooks/ddtree/patches"     # patches folders: loading builds (or reuses) each
VERSIONS = ("0.5.13.post1", "0.5.23")


def _wheel(version: str) -> Path:
    wheel = P.find_wheel("sglang", version)
    if wheel is None:
        pytest.skip(f"sglang {version} wheel not cached in {P.WHEEL_CACHE}")
    return wheel


def _base_hashes(ps: P.PatchSet) -> dict[str, str]:
    """What a pristine install of the base has at the patch set's paths, read from the wheel."""
    out = {}
    with zipfile.ZipFile(_wheel(ps.version)) as zf:
        names = set(zf.namelist())
        for entry in ps.files:
            if entry.path in names:
                out[entry.path] = hashlib.sha256(zf.read(entry.path)).hexdigest()
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_shipped_patchsets_verify_against_the_real_record(version):
    ps = B.load_patchset(PATCHSETS / f"sglang-{version}")
    assert (ps.package, ps.version) == ("sglang", version)
    result = P.verify_patchset(ps)
    assert result.record_checked == (P.find_wheel("sglang", version) is not None)
    assert {"sglang/srt/speculative/ddtree_utils.py", "sglang/srt/speculative/ddtree_config.py"} <= {
        f.path for f in ps.files if f.action == "add"}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pristine_base_passes_check_base(version):
    ps = B.load_patchset(PATCHSETS / f"sglang-{version}")
    P.check_base(ps, version, _base_hashes(ps))


def test_other_version_is_refused_naming_both():
    ps = B.load_patchset(PATCHSETS / "sglang-0.5.13.post1")
    with pytest.raises(UserError, match=r"sglang==0\.5\.13\.post1.*sglang==0\.5\.23"):
        P.check_base(ps, "0.5.23", _base_hashes(ps))


def test_drifted_base_file_is_refused_naming_it():
    ps = B.load_patchset(PATCHSETS / "sglang-0.5.13.post1")
    hashes = _base_hashes(ps)
    drifted = ps.replaced[1].path
    hashes[drifted] = "0" * 64
    with pytest.raises(UserError) as err:
        P.check_base(ps, "0.5.13.post1", hashes)
    assert str(err.value).startswith(drifted) and "\n" not in str(err.value)
    del hashes[drifted]
    with pytest.raises(UserError, match="no such file"):
        P.check_base(ps, "0.5.13.post1", hashes)


def test_unknown_file_at_an_added_path_is_refused():
    ps = B.load_patchset(PATCHSETS / "sglang-0.5.13.post1")
    hashes = _base_hashes(ps) | {"sglang/srt/speculative/ddtree_utils.py": "1" * 64}
    with pytest.raises(UserError, match="ddtree_utils.py exists on the host"):
        P.check_base(ps, "0.5.13.post1", hashes)


def test_select_patchset_names_the_host_version_and_those_available():
    mapping = {"0.5.13.post1": "a", "0.5.23": "b"}
    assert P.select_patchset(mapping, "0.5.23") == "b"
    with pytest.raises(UserError, match=r"ct7 runs sglang 0\.5\.12; .*0\.5\.13\.post1, 0\.5\.23"):
        P.select_patchset(mapping, "0.5.12", host="ct7")


# --- validation -----------------------------------------------------------------------------


def _write(folder: Path, files: dict[str, bytes], entries=None, extra=()) -> Path:
    for rel, data in files.items():
        (folder / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "files" / rel).write_bytes(data)
    if entries is None:
        entries = [{"path": rel, "action": "add", "sha256": hashlib.sha256(d).hexdigest()}
                   for rel, d in files.items()]
    (folder / "manifest.json").write_text(json.dumps(
        {"package": "sglang", "version": "0.5.23", "files": entries, "extra_top_level": list(extra)}))
    return folder


def test_a_minimal_patchset_loads(tmp_path):
    ps = B.load_patchset(_write(tmp_path, {"sglang/x.py": b"x = 1\n"}))
    assert ps.files[0].action == "add"


@pytest.mark.parametrize("path, expected", [
    ("/etc/passwd", "relative POSIX path"),
    ("sglang/../torch/x.py", "'..'"),
    ("torch/x.py", "inside sglang"),
    ("sglang", "inside a package folder"),
    ("sglang//x.py", "'..'"),
    ("sglang/a b.py", "relative POSIX path"),
])
def test_bad_paths_are_refused_naming_manifest_and_entry(tmp_path, path, expected):
    folder = _write(tmp_path, {"sglang/x.py": b"1"},
                    entries=[{"path": path, "action": "add", "sha256": "a" * 64}])
    with pytest.raises(ConfigError) as err:
        B.load_patchset(folder)
    msg = str(err.value)
    assert msg.startswith(f"{folder / 'manifest.json'}: files[0].path:") and expected in msg


def test_symlinks_in_the_folder_are_refused(tmp_path):
    folder = _write(tmp_path, {"sglang/x.py": b"1"})
    (folder / "files/sglang/y.py").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError, match="symlinks are refused"):
        B.load_patchset(folder)


def test_unlisted_and_missing_files_are_refused(tmp_path):
    folder = _write(tmp_path / "a", {"sglang/x.py": b"1"})
    (folder / "files/sglang/stray.py").write_text("")
    with pytest.raises(ConfigError, match="stray.py is not"):
        B.load_patchset(folder)
    folder = _write(tmp_path / "b", {"sglang/x.py": b"1"},
                    entries=[{"path": "sglang/gone.py", "action": "add", "sha256": "a" * 64}])
    with pytest.raises(ConfigError, match="files/sglang/gone.py to exist"):
        B.load_patchset(folder)


def test_replace_needs_a_base_hash_and_add_has_none(tmp_path):
    sha = hashlib.sha256(b"1").hexdigest()
    folder = _write(tmp_path / "a", {"sglang/x.py": b"1"},
                    entries=[{"path": "sglang/x.py", "action": "replace", "sha256": sha}])
    with pytest.raises(ConfigError, match=r"files\[0\] \(sglang/x.py\).base_sha256"):
        B.load_patchset(folder)
    folder = _write(tmp_path / "b", {"sglang/x.py": b"1"},
                    entries=[{"path": "sglang/x.py", "action": "add", "sha256": sha, "base_sha256": sha}])
    with pytest.raises(ConfigError, match="no base_sha256 on an added file"):
        B.load_patchset(folder)


def test_extra_top_level_admits_a_plugin_and_its_dist_info(tmp_path):
    files = {"ddtree_plugin/__init__.py": b"", "ddtree_plugin-1.0.dist-info/METADATA": b"Name: x\n"}
    folder = _write(tmp_path / "a", files, extra=["ddtree_plugin", "ddtree_plugin-1.0.dist-info"])
    assert B.load_patchset(folder).extra_top_level == ("ddtree_plugin", "ddtree_plugin-1.0.dist-info")
    folder = _write(tmp_path / "b", {"sglang/x.py": b""}, extra=["../evil"])
    with pytest.raises(ConfigError, match=r"extra_top_level\[0\]"):
        B.load_patchset(folder)


def test_verify_catches_a_tampered_file(tmp_path):
    src = B.load_patchset(PATCHSETS / "sglang-0.5.13.post1").root
    folder = tmp_path / "ps"
    shutil.copytree(src, folder)
    target = folder / "files/sglang/srt/speculative/spec_info.py"
    target.write_text(target.read_text() + "# tampered\n")
    with pytest.raises(ConfigError, match=r"spec_info.py\)\.sha256"):
        P.verify_patchset(B.load_patchset(folder))


# --- build ----------------------------------------------------------------------------------


def test_build_uses_the_real_record(tmp_path):
    wheel = _wheel("0.5.13.post1")
    record = P.read_record(wheel)
    src = tmp_path / "src"
    with zipfile.ZipFile(wheel) as zf:
        base = zf.read("sglang/srt/speculative/spec_info.py")
    (src / "sglang/srt/speculative").mkdir(parents=True)
    (src / "sglang/srt/speculative/spec_info.py").write_bytes(base + b"\n# changed\n")
    (src / "sglang/srt/speculative/new.py").write_text("x = 1\n")
    (src / "sglang/srt/speculative/__pycache__").mkdir()
    (src / "sglang/srt/speculative/__pycache__/new.cpython-311.pyc").write_bytes(b"junk")
    ps = B.build_patchset("sglang==0.5.13.post1", src, tmp_path / "out", P.WHEEL_CACHE)
    by_path = {f.path: f for f in ps.files}
    assert set(by_path) == {"sglang/srt/speculative/spec_info.py", "sglang/srt/speculative/new.py"}
    replaced = by_path["sglang/srt/speculative/spec_info.py"]
    assert replaced.action == "replace" and replaced.base_sha256 == record[replaced.path]
    assert replaced.base_sha256 == hashlib.sha256(base).hexdigest()
    assert by_path["sglang/srt/speculative/new.py"].action == "add"
    P.verify_patchset(ps)
    (src / "sglang/srt/speculative/spec_info.py").write_bytes(base)
    with pytest.raises(ConfigError, match="identical"):
        B.build_patchset("sglang==0.5.13.post1", src, tmp_path / "out2", P.WHEEL_CACHE)


def test_build_needs_the_wheel(tmp_path):
    (tmp_path / "src/sglang").mkdir(parents=True)
    (tmp_path / "src/sglang/x.py").write_text("")
    with pytest.raises(UserError, match="no wheel for sglang==9.9"):
        B.build_patchset("sglang==9.9", tmp_path / "src", tmp_path / "out", tmp_path)
    with pytest.raises(UserError, match="PACKAGE==VERSION"):
        P.parse_base("sglang")


# --- CLI ------------------------------------------------------------------------------------


def test_cli_show_verify_and_refusal(tmp_path):
    runner = CliRunner()
    folder = str(PATCHSETS / "sglang-0.5.13.post1")
    out = runner.invoke(main, ["patchset", "show", folder])
    assert out.exit_code == 0 and "sglang/srt/server_args.py" in out.output and "replace" in out.output
    out = runner.invoke(main, ["patchset", "show", "--json", folder])
    assert json.loads(out.output)["version"] == "0.5.13.post1"
    out = runner.invoke(main, ["patchset", "verify", folder])
    assert out.exit_code == 0 and out.output.startswith("ok:")
    bad = _write(tmp_path, {"sglang/x.py": b"1"}, entries=[{"path": "/x", "action": "add", "sha256": "a" * 64}])
    out = runner.invoke(main, ["patchset", "verify", str(bad)])
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_every_shipped_python_file_compiles(version):
    ps = B.load_patchset(PATCHSETS / f"sglang-{version}")
    for entry in ps.files:
        if entry.path.endswith(".py"):
            compile(ps.source(entry).read_text(), str(ps.source(entry)), "exec")


def test_hosts_that_start_together_share_one_load_of_the_patch_set(tmp_path, monkeypatch):
    """A fleet's host threads reach preflight at once: one of them loads (for a patches folder,
    hashing the whole sglang wheel), the others take its result. Each load is slowed so that
    they would overlap without the lock."""
    import threading
    import time

    from fleetspec.build import patchset as patchset_mod
    from fleetspec.ops.selection import load_patchset_once

    folder = _write(tmp_path, {"sglang/x.py": b"x = 1\n"})
    real, loads = patchset_mod.load_patchset, []

    def slow_load(f):
        loads.append(f)
        time.sleep(0.2)
        return real(f)

    monkeypatch.setattr(patchset_mod, "load_patchset", slow_load)
    start, got = threading.Barrier(6), []

    def host():
        start.wait()
        got.append(load_patchset_once(folder))

    threads = [threading.Thread(target=host) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len(got) == 6 and all(g is got[0] for g in got)


def test_a_deploy_loads_each_patch_set_once_until_a_file_changes(tmp_path):
    """selection.load_patchset_once: one load for N hosts, a fresh one after an edit, and
    a broken folder refused for every host (failures are not kept)."""
    from fleetspec.ops.selection import load_patchset_once

    folder = _write(tmp_path, {"sglang/x.py": b"x = 1\n"})
    first = load_patchset_once(folder)
    assert load_patchset_once(folder) is first
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "files/sglang/x.py").write_bytes(b"x = 22\n")
    manifest["files"][0]["sha256"] = hashlib.sha256(b"x = 22\n").hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    again = load_patchset_once(folder)
    assert again is not first and again.files[0].sha256 == manifest["files"][0]["sha256"]
    (folder / "files/sglang/y.py").write_bytes(b"unlisted\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match="y.py"):
            load_patchset_once(folder)

"""Patch sets: files that add to or replace modules of one exact package version.

A patch set is a folder with `manifest.json` and `files/<path>`; every path is relative to
site-packages and starts with the package's folder or a name in `extra_top_level`. A replaced file
carries the sha256 of the base file it expects, taken from that version's pip RECORD, so a host whose
install drifted is refused before anything on it changes.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Mapping, TypeVar

from fleetspec.errors import ConfigError, UserError
from fleetspec.model.cache import cache_dir
from fleetspec.model.names import is_name

MANIFEST = "manifest.json"
FILES = "files"
ACTIONS = ("add", "replace")
WHEEL_CACHE = cache_dir() / "wheels"
_HEX = re.compile(r"^[0-9a-f]{64}$")
TOP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(-[A-Za-z0-9_.+]+\.dist-info)?")   # fullmatch
_SKIP = ("__pycache__",)

T = TypeVar("T")


@dataclass(frozen=True)
class PatchFile:
    path: str
    action: str
    sha256: str
    base_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"path": self.path, "action": self.action, "sha256": self.sha256}
        if self.base_sha256 is not None:
            out["base_sha256"] = self.base_sha256
        return out


@dataclass(frozen=True)
class PatchSet:
    root: Path
    package: str
    version: str
    files: tuple[PatchFile, ...]
    extra_top_level: tuple[str, ...] = ()

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    @property
    def files_dir(self) -> Path:
        return self.root / FILES

    def source(self, entry: PatchFile) -> Path:
        return self.files_dir / entry.path

    @property
    def replaced(self) -> tuple[PatchFile, ...]:
        return tuple(f for f in self.files if f.action == "replace")

    def to_json(self) -> dict[str, Any]:
        return {"package": self.package, "version": self.version,
                "files": [f.to_json() for f in self.files],
                "extra_top_level": list(self.extra_top_level)}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def path_problem(path: object, package: str, extra_top_level: Collection[str] = ()) -> str | None:
    """Why `path` may not appear in a patch set of `package`, or None when it may."""
    if not isinstance(path, str) or not path:
        return "a non-empty relative path"
    if path.startswith("/") or "\\" in path or any(c.isspace() or ord(c) < 32 for c in path):
        return f"a relative POSIX path, got {path!r}"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"a path without '', '.' or '..' parts, got {path!r}"
    if parts[0] != package and parts[0] not in extra_top_level:
        allowed = ", ".join([package, *extra_top_level])
        return f"a path inside {allowed}, got {path!r}"
    if len(parts) < 2:
        return f"a file inside a package folder, got {path!r}"
    return None


def read_patchset(folder: Path | str) -> PatchSet:
    """Read and validate a built patch set's structure (hashes are checked by `verify_patchset`);
    fleetspec.build.patchset.load_patchset builds a patches folder first."""
    root = Path(folder)
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise ConfigError(manifest, None, "a patch set manifest (file not found)")
    refuse_symlinks(root)
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(manifest, None, f"valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(manifest, None, "a JSON object")
    package = _str_field(manifest, data, "package")
    if not is_name(package) or not TOP_NAME.fullmatch(package):
        # The overlay script makes and links <site-packages>/<package>: a path or `..` here works outside it.
        raise ConfigError(manifest, "package", f"a top-level package name (letters, digits, '_'), got {package!r}")
    version = _str_field(manifest, data, "version")
    extra = data.get("extra_top_level", [])
    if not isinstance(extra, list):
        raise ConfigError(manifest, "extra_top_level", "a list of top-level names")
    for i, name in enumerate(extra):
        if not isinstance(name, str) or not TOP_NAME.fullmatch(name) or ".." in name or name == package:
            raise ConfigError(manifest, f"extra_top_level[{i}]",
                              f"a package or *.dist-info folder name other than {package!r}, got {name!r}")
    raw_files = data.get("files")
    if not isinstance(raw_files, list) or not raw_files:
        raise ConfigError(manifest, "files", "a non-empty list of file entries")
    files, seen = [], set()
    for i, entry in enumerate(raw_files):
        files.append(_file_entry(manifest, i, entry, package, tuple(extra)))
        if files[-1].path in seen:
            raise ConfigError(manifest, f"files[{i}]", f"each path once, got {files[-1].path!r} twice")
        seen.add(files[-1].path)
    ps = PatchSet(root, package, version, tuple(files), tuple(extra))
    _check_tree_matches(ps, seen)
    return ps


def _str_field(manifest: Path, data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(manifest, key, "a non-empty string")
    return value


def _file_entry(manifest: Path, i: int, entry: object, package: str, extra: tuple[str, ...]) -> PatchFile:
    key = f"files[{i}]"
    if not isinstance(entry, dict):
        raise ConfigError(manifest, key, "an object with path, action, sha256")
    path = entry.get("path")
    problem = path_problem(path, package, extra)
    if problem:
        raise ConfigError(manifest, f"{key}.path", problem)
    key = f"files[{i}] ({path})"
    action = entry.get("action")
    if action not in ACTIONS:
        raise ConfigError(manifest, f"{key}.action", f"one of {', '.join(ACTIONS)}, got {action!r}")
    sha = entry.get("sha256")
    if not isinstance(sha, str) or not _HEX.match(sha):
        raise ConfigError(manifest, f"{key}.sha256", "64 lowercase hex digits")
    base = entry.get("base_sha256")
    if action == "replace" and (not isinstance(base, str) or not _HEX.match(base)):
        raise ConfigError(manifest, f"{key}.base_sha256", "64 lowercase hex digits for a replaced file")
    if action == "add" and base is not None:
        raise ConfigError(manifest, f"{key}.base_sha256", "no base_sha256 on an added file")
    unknown = set(entry) - {"path", "action", "sha256", "base_sha256"}
    if unknown:
        raise ConfigError(manifest, key, f"only path, action, sha256, base_sha256; got {sorted(unknown)}")
    return PatchFile(str(path), action, sha, base)


def refuse_symlinks(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                raise ConfigError(p, None, "a regular file or folder (symlinks are refused in a patch set)")


def _check_tree_matches(ps: PatchSet, listed: set[str]) -> None:
    for entry in ps.files:
        if not ps.source(entry).is_file():
            raise ConfigError(ps.manifest_path, f"files ({entry.path})", f"the file {FILES}/{entry.path} to exist")
    if ps.files_dir.is_dir():
        for p in sorted(ps.files_dir.rglob("*")):
            rel = p.relative_to(ps.files_dir).as_posix()
            if p.is_file() and rel not in listed and not skipped(rel):
                raise ConfigError(ps.manifest_path, "files",
                                  f"every file under {FILES}/ listed; {rel} is not")


def skipped(rel: str) -> bool:
    return any(part in _SKIP for part in rel.split("/")) or rel.endswith(".pyc")


# --- the base wheel -------------------------------------------------------------------------


def find_wheel(package: str, version: str, wheels: Path = WHEEL_CACHE) -> Path | None:
    stem = re.sub(r"[-_.]+", "_", package).lower()
    found = sorted(Path(wheels).glob(f"{stem}-{version}-*.whl")) if Path(wheels).is_dir() else []
    return found[0] if found else None


def read_record(wheel: Path) -> dict[str, str]:
    """path -> sha256 hex for every hashed file in the wheel's RECORD."""
    with zipfile.ZipFile(wheel) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
        if name is None:
            raise UserError(f"{wheel}: no .dist-info/RECORD in the wheel")
        text = zf.read(name).decode("utf-8")
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = row[1].removeprefix("sha256=")
            out[row[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return out


def parse_base(base: str) -> tuple[str, str]:
    package, sep, version = base.partition("==")
    if not sep or not package or not version:
        raise UserError(f"--base must be PACKAGE==VERSION, got {base!r}")
    return package.strip(), version.strip()


# --- verify, check -------------------------------------------------------------------------


@dataclass(frozen=True)
class Verified:
    patchset: PatchSet
    record_checked: bool
    wheel: Path | None


def verify_patchset(ps: PatchSet, wheels: Path = WHEEL_CACHE) -> Verified:
    """Files match their hashes; replaced files' base hashes are the real RECORD's (wheel permitting)."""
    for i, entry in enumerate(ps.files):
        got = sha256_file(ps.source(entry))
        if got != entry.sha256:
            raise ConfigError(ps.manifest_path, f"files[{i}] ({entry.path}).sha256",
                              f"{entry.sha256} as in {FILES}/{entry.path}, which hashes to {got}")
    wheel = find_wheel(ps.package, ps.version, wheels)
    if wheel is None:
        return Verified(ps, False, None)
    record = read_record(wheel)
    for i, entry in enumerate(ps.files):
        key = f"files[{i}] ({entry.path})"
        if entry.action == "replace" and record.get(entry.path) != entry.base_sha256:
            want = record.get(entry.path) or "no such file"
            raise ConfigError(ps.manifest_path, f"{key}.base_sha256",
                              f"the sha256 in {ps.package}=={ps.version}'s RECORD ({want})")
        if entry.action == "add" and entry.path in record:
            raise ConfigError(ps.manifest_path, f"{key}.action",
                              f"replace: {ps.package}=={ps.version} already has this file")
    return Verified(ps, True, wheel)


def check_base(ps: PatchSet, installed_version: str, installed_hashes: Mapping[str, str],
               where: str = "on the host") -> None:
    """Refuse an install (`where`: the host's, or an image's) that is not this patch set's base,
    naming the first differing file.

    installed_hashes: sha256 of each of the patch set's paths that exists there.
    """
    if installed_version != ps.version:
        raise UserError(f"patch set {ps.root.name} is for {ps.package}=={ps.version}; "
                        f"{ps.package}=={installed_version} is installed {where}")
    for entry in ps.files:
        have = installed_hashes.get(entry.path)
        if entry.action == "replace" and have != entry.base_sha256:
            found = f"sha256 {have}" if have else "no such file"
            raise UserError(f"{entry.path} {where} differs from {ps.package}=={ps.version}: "
                            f"expected sha256 {entry.base_sha256}, found {found}")
        if entry.action == "add" and have is not None and have != entry.sha256:
            raise UserError(f"{entry.path} exists {where} but not in {ps.package}=={ps.version}; "
                            "refusing to shadow an unknown file")


def select_patchset(patchsets: Mapping[str, T], version: str, host: str | None = None) -> T:
    """The patch set for a host's installed version; refuse a version the playbook has none for."""
    if version in patchsets:
        return patchsets[version]
    who = f"host {host} runs" if host else "the host runs"
    have = ", ".join(sorted(patchsets)) or "none"
    raise UserError(f"{who} sglang {version}; this playbook has patch sets for: {have}")

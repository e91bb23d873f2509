"""Patch sets generated from a patches folder: reviewable diffs over the base wheel, payload laid in.

`playbooks/<algo>/patches/<package>-<version>/` holds `series` (the diffs' names in order, `#`
comments), the unified diffs (one per changed file of the package) and `add` (lines of
`<site-packages path> <source relative to the folder>`, a trailing `/` on both for a folder).
`build` takes each changed file from the cached wheel (its sha256 checked against the wheel's RECORD),
applies the diffs with zero fuzz, lays the added files in, and writes the manifest.json + files/ that
deploy ships under `<cache>/patchsets/<inputs hash>/<folder name>/`, so the same inputs build once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fleetspec.errors import ConfigError, UserError
from fleetspec.model import patchset, unidiff
from fleetspec.model.cache import cache_dir
from fleetspec.model.patchset import (
    FILES,
    MANIFEST,
    TOP_NAME,
    WHEEL_CACHE,
    PatchFile,
    PatchSet,
    find_wheel,
    parse_base,
    path_problem,
    read_patchset,
    read_record,
    refuse_symlinks,
    sha256_file,
    skipped,
)

SERIES = "series"
ADD = "add"
BUILDER_VERSION = "1"   # bump when the output for the same inputs changes
PATCHSET_CACHE = cache_dir() / "patchsets"
_SKIP = ("__pycache__",)


@dataclass(frozen=True)
class Recipe:
    root: Path
    package: str
    version: str
    diffs: tuple[Path, ...]
    adds: tuple[tuple[str, Path], ...]   # (path in site-packages, source file); folders expanded


@dataclass(frozen=True)
class Built:
    patchset: PatchSet
    built: bool          # False: reused from the cache
    inputs: str          # the inputs hash (the cache folder's name)


def is_patches_folder(folder: Path | str) -> bool:
    return (Path(folder) / SERIES).is_file() and not (Path(folder) / MANIFEST).exists()


def load_patchset(folder: Path | str) -> PatchSet:
    """The patch set in `folder`: a patches folder (`series` + diffs, no manifest) is built, or
    taken from the build cache, first; a built one is read as it is."""
    if is_patches_folder(folder):
        return build(folder).patchset
    return read_patchset(folder)


def _lines(path: Path) -> list[tuple[int, str]]:
    out = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append((n, line))
    return out


def load_recipe(folder: Path | str) -> Recipe:
    """Read a patches folder: its name gives package and version, `series` the diffs, `add` the rest."""
    root = Path(folder)
    package, sep, version = root.name.partition("-")
    if not sep or not package or not version:
        raise ConfigError(root, None, "a patches folder named <package>-<version>, e.g. sglang-0.5.23")
    diffs = []
    for n, name in _lines(root / SERIES):
        diff = root / name
        if "/" in name or name.startswith(".") or not diff.is_file() or diff.is_symlink():
            raise ConfigError(root / SERIES, f"line {n}", f"the name of a diff file in {root}, got {name!r}")
        diffs.append(diff)
    adds: list[tuple[str, Path]] = []
    if (root / ADD).is_file():
        for n, line in _lines(root / ADD):
            adds.extend(_add_line(root, n, line))
    dests = [d for d, _ in adds]
    twice = sorted({d for d in dests if dests.count(d) > 1})
    if twice:
        raise ConfigError(root / ADD, None, f"each path once, got {twice[0]!r} twice")
    return Recipe(root, package, version, tuple(diffs), tuple(adds))


def _add_line(root: Path, n: int, line: str) -> list[tuple[str, Path]]:
    where = (root / ADD, f"line {n}")
    parts = line.split()
    if len(parts) != 2:
        raise ConfigError(*where, f"'<path in site-packages> <source>', got {line!r}")
    dest, rel = parts
    src = root / rel
    if Path(rel).is_absolute() or dest.startswith("/") or dest.endswith("/") != rel.endswith("/"):
        raise ConfigError(*where, f"relative paths, both ending in / for a folder, got {line!r}")
    if any(part in ("", ".", "..") for part in dest.rstrip("/").split("/")) or "\\" in dest:
        # `..` wrote outside the build folder and left the file out of the patch set
        raise ConfigError(*where, f"a path in site-packages of plain parts (no '.', '..' or empty part), "
                                  f"got {dest!r}")
    if src.is_symlink() or not (src.is_dir() if rel.endswith("/") else src.is_file()):
        what = "folder" if rel.endswith("/") else "file"
        raise ConfigError(*where, f"a {what} at {rel} (relative to {root}), not found")
    if not rel.endswith("/"):
        return [(dest, src)]
    out = []
    for p in sorted(src.rglob("*")):
        sub = p.relative_to(src).as_posix()
        if p.is_symlink():
            raise ConfigError(p, None, "a regular file (symlinks are refused in a patch set)")
        if p.is_file() and not any(s in sub.split("/") for s in _SKIP) and not sub.endswith(".pyc"):
            out.append((dest + sub, p))
    return out


def wheel_sha256(wheel: Path) -> str:
    """The wheel's sha256, remembered in `.<wheel>.sha256` beside it with the size, mtime and inode
    it had: every deploy keys the build cache on it, and hashing sglang 0.5.23's 39 MB wheel cost
    each run ~30 ms of CPU. A wheel written again in any way has a new stamp and is hashed again;
    a folder that cannot take the note only costs the hash."""
    st = wheel.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    note = wheel.with_name(f".{wheel.name}.sha256")
    try:
        kept = json.loads(note.read_text())
        if isinstance(kept, dict) and kept.get("stamp") == stamp and isinstance(kept.get("sha256"), str):
            return str(kept["sha256"])
    except (OSError, ValueError):
        pass
    digest = sha256_file(wheel)
    tmp = note.with_name(f"{note.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"stamp": stamp, "sha256": digest}))
        os.replace(tmp, note)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return digest


def inputs_hash(recipe: Recipe, wheel: Path) -> str:
    """One hash over everything the output depends on: builder, base wheel, diffs, added files."""
    h = hashlib.sha256()
    h.update(json.dumps([BUILDER_VERSION, recipe.package, recipe.version, wheel_sha256(wheel)]).encode())
    for diff in recipe.diffs:
        h.update(b"diff\0" + diff.name.encode() + b"\0" + diff.read_bytes() + b"\0")
    for dest, src in recipe.adds:
        h.update(b"add\0" + dest.encode() + b"\0" + src.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def patched_files(recipe: Recipe, wheel: Path) -> dict[str, bytes]:
    """Every file the diffs change, taken from the wheel (checked against RECORD) and patched."""
    record = read_record(wheel)
    out: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as zf:
        for diff in recipe.diffs:
            for fp in unidiff.parse(diff.read_bytes(), diff):
                if fp.path not in out:
                    out[fp.path] = _base_file(zf, record, fp.path, diff, recipe)
                out[fp.path] = unidiff.apply(out[fp.path], fp, diff)
    return out


def _base_file(zf: zipfile.ZipFile, record: dict[str, str], path: str, diff: Path, recipe: Recipe) -> bytes:
    base = f"{recipe.package}=={recipe.version}"
    if path not in record:
        raise ConfigError(diff, path, f"a file of {base} (its wheel's RECORD has no such file)")
    data = zf.read(path)
    got = hashlib.sha256(data).hexdigest()
    if got != record[path]:
        raise UserError(f"{zf.filename}: {path} hashes to {got}, but the wheel's RECORD says "
                        f"{record[path]}; refusing a base that is not {base} as released")
    return data


def build(folder: Path | str, wheels: Path | None = None, cache: Path | None = None) -> Built:
    """The patch set of a patches folder, from the cache when its inputs were built before.

    wheels, cache: default to $FLEETSPEC_CACHE/wheels and $FLEETSPEC_CACHE/patchsets.
    """
    wheels = Path(wheels or patchset.WHEEL_CACHE)
    cache = Path(cache or PATCHSET_CACHE)
    recipe = load_recipe(folder)
    wheel = find_wheel(recipe.package, recipe.version, wheels)
    if wheel is None:
        raise UserError(f"{recipe.root}: no wheel for {recipe.package}=={recipe.version} in {wheels} (the "
                        f"patch set is built from it); run: pip download --no-deps "
                        f"{recipe.package}=={recipe.version} -d {wheels}")
    key = inputs_hash(recipe, wheel)
    out = Path(cache) / key / recipe.root.name
    if (out / MANIFEST).is_file():
        return Built(read_patchset(out), False, key)
    try:
        _build_into(recipe, wheel, wheels, out)
    except OSError as err:
        raise UserError(f"cannot write the patch set cache {cache}: {err.strerror or err}; "
                        "set FLEETSPEC_CACHE to a writable folder") from None
    return Built(read_patchset(out), True, key)


def _build_into(recipe: Recipe, wheel: Path, wheels: Path, out: Path) -> None:
    changed = patched_files(recipe, wheel)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=out.parent))
    try:
        src = work / "src"
        for rel, data in changed.items():
            _write(src / rel, data)
        for dest, path in recipe.adds:
            if dest in changed:
                raise ConfigError(recipe.root / ADD, dest, "a path no diff changes (it is both patched and added)")
            _write(src / dest, path.read_bytes())
        build_patchset(f"{recipe.package}=={recipe.version}", src, work / recipe.root.name, wheels)
        try:
            os.rename(work / recipe.root.name, out)
        except OSError:
            if not (out / MANIFEST).is_file():   # a concurrent build that finished first is as good
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def patches_folders(root: Path | str, version: str | None = None) -> list[Path]:
    """The patches folders under a fleet root's playbooks, optionally of one version."""
    found = sorted(p.parent for p in Path(root, "playbooks").glob(f"*/patches/*/{SERIES}"))
    return [f for f in found if version is None or f.name.partition("-")[2] == version]


def _record_for(package: str, version: str, wheels: Path) -> dict[str, str]:
    wheel = find_wheel(package, version, wheels)
    if wheel is None:
        raise UserError(f"no wheel for {package}=={version} in {wheels}; "
                        f"run: pip download --no-deps {package}=={version} -d {wheels}")
    return read_record(wheel)


def build_patchset(base: str, source: Path | str, out: Path | str, wheels: Path = WHEEL_CACHE) -> PatchSet:
    """Write a patch set for `base` from a folder of changed files laid out as in site-packages.

    A file that the base wheel's RECORD lists is `replace` (with its base hash), any other is `add`.
    Top-level names other than the package become `extra_top_level`. `out` may be the folder that
    `source` lives in: the new patch set is assembled aside and swapped in at the end.
    """
    package, version = parse_base(base)
    source, out = Path(source), Path(out)
    if not source.is_dir():
        raise UserError(f"--from {source}: not a folder")
    refuse_symlinks(source)
    record = _record_for(package, version, wheels)
    rels = sorted(p.relative_to(source).as_posix() for p in source.rglob("*")
                  if p.is_file() and not skipped(p.relative_to(source).as_posix()))
    if not rels:
        raise UserError(f"--from {source}: no files")
    tops = sorted({r.split("/")[0] for r in rels} - {package})
    entries = []
    for rel in rels:
        problem = path_problem(rel, package, tops)
        if problem or not TOP_NAME.fullmatch(rel.split("/")[0]):
            raise ConfigError(source / rel, None, problem or "a top-level package or *.dist-info name")
        sha = sha256_file(source / rel)
        if rel in record:
            if record[rel] == sha:
                raise ConfigError(source / rel, None,
                                  f"a change to {package}=={version}'s file (it is identical; drop it)")
            entries.append(PatchFile(rel, "replace", sha, record[rel]))
        else:
            entries.append(PatchFile(rel, "add", sha))
    ps = PatchSet(out, package, version, tuple(entries), tuple(tops))
    staging = out.with_name(out.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / FILES).mkdir(parents=True)
    for entry in entries:
        dest = staging / FILES / entry.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / entry.path, dest)
    (staging / MANIFEST).write_text(json.dumps(ps.to_json(), indent=2) + "\n")
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return read_patchset(out)

"""The shell that builds a release's overlay on the host: the installed package as a symlink farm,
with the patch set's files laid over it as real files.

With `PYTHONPATH=<overlay>` Python imports the package from the overlay, so the live venv is never
edited and switching back is dropping the path. The script builds aside, checks every patched
file's sha256 in place, then renames, so a half-built overlay is never used.

The farm is minimal: only the folders on the way to a patched file are real folders; every other
entry is one symlink to the installed file or folder. sglang has 6,000–11,000 entries; linking
each (`cp -as`) cost 1–2 s of the host's CPU per deploy and as much again to prune the release,
which is what stopped a deploy to 8 hosts sharing CPUs from scaling. A folder holding a patched
module also gets a real `__pycache__` (links to every other module's bytecode), so Python writes
the patched module's bytecode into the release, never into the live venv.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Mapping

q = shlex.quote


def overlay_script(site_packages: str, patchset_files_dir: str, dest: str, patchset,
                   extra: Mapping[str, str] | None = None) -> str:
    """Shell text that builds `dest`.

    patchset: fleetspec.model.patchset.PatchSet (its package, files and extra_top_level);
    patchset_files_dir: where its `files/` tree lies on the host;
    extra: overlay-relative path -> host path of further files to copy in (built kernels).
    """
    site = PurePosixPath(site_packages)
    files = PurePosixPath(patchset_files_dir)
    tmp = f"{dest}.building"
    targets = [PurePosixPath(e.path) for e in patchset.files] + [PurePosixPath(r) for r in (extra or {})]
    real = _real_folders(PurePosixPath(patchset.package), targets)
    lines = [
        "set -eu",
        f"rm -rf -- {q(tmp)}",
        f"mkdir -p -- {q(tmp)}",
        f"test -d {q(str(site / patchset.package))}",
    ]
    for folder in sorted(real, key=lambda p: (len(p.parts), str(p))):
        keep_out = sorted({t.name for t in targets if t.parent == folder}
                          | {d.name for d in real if d.parent == folder})
        if folder.name == "__pycache__":      # the replaced modules' bytecode would shadow them
            keep_out += sorted(f"{t.stem}.*.pyc" for t in targets if t.parent == folder.parent and t.suffix == ".py")
        excludes = " ".join(f"! -name {q(name)}" for name in keep_out)
        source, built = q(str(site / folder)), q(f"{tmp}/{folder}")
        lines.append(f"mkdir -p -- {built}")
        lines.append(f"if [ -d {source} ]; then find {source} -mindepth 1 -maxdepth 1 {excludes} "
                     f"-exec ln -s -t {built} -- {{}} +; fi")
    for entry in patchset.files:
        lines.append(f"cp -- {q(str(files / entry.path))} {q(f'{tmp}/{entry.path}')}")
    for rel, source in (extra or {}).items():
        lines.append(f"cp -- {q(source)} {q(f'{tmp}/{PurePosixPath(rel)}')}")
    checks = "\n".join(f"{entry.sha256}  {entry.path}" for entry in patchset.files)
    lines += [
        f"(cd {q(tmp)} && sha256sum --quiet --strict -c -) <<'FLEETSPEC_SHA256'\n{checks}\nFLEETSPEC_SHA256",
        f"rm -rf -- {q(dest)}",
        f"mv -- {q(tmp)} {q(dest)}",
    ]
    return "\n".join(lines) + "\n"


def _real_folders(package: PurePosixPath, targets: list[PurePosixPath]) -> set[PurePosixPath]:
    """The folders that must be real (not links): the package's, every folder above a target, and
    the `__pycache__` beside a replaced module."""
    real = {package}
    for target in targets:
        real.update(p for p in target.parents if p != PurePosixPath("."))
        if target.suffix == ".py":
            real.add(target.parent / "__pycache__")
    return real



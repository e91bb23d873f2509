"""The shell that builds a release's overlay on the host: the installed package as a symlink farm,
with the patch set's files laid over it as real files.

With `PYTHONPATH=<overlay>` Python imports the package from the overlay, so the live venv is never
edited and switching back is dropping the path. The script builds aside, checks every patched
file's sha256 in place, then renames, so a half-built overlay is never used.
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
    lines = [
        "set -eu",
        f"rm -rf -- {q(tmp)}",
        f"mkdir -p -- {q(tmp)}",
        f"test -d {q(str(site / patchset.package))}",
        f"cp -as -- {q(str(site / patchset.package))} {q(tmp + '/' + patchset.package)}",
    ]
    for entry in patchset.files:
        path = PurePosixPath(entry.path)
        target = f"{tmp}/{path}"
        lines.append(f"mkdir -p -- {q(f'{tmp}/{path.parent}')}")
        lines.append(f"rm -f -- {q(target)}")
        if path.suffix == ".py":
            # A stale bytecode link would shadow the new source under hash-based pyc validation.
            lines.append(f"rm -f -- {q(f'{tmp}/{path.parent}/__pycache__/{path.stem}')}.*.pyc")
        lines.append(f"cp -- {q(str(files / path))} {q(target)}")
    for rel, source in (extra or {}).items():
        target = f"{tmp}/{PurePosixPath(rel)}"
        lines.append(f"mkdir -p -- {q(str(PurePosixPath(target).parent))}")
        lines.append(f"cp -- {q(source)} {q(target)}")
    checks = "\n".join(f"{entry.sha256}  {entry.path}" for entry in patchset.files)
    lines += [
        f"(cd {q(tmp)} && sha256sum --quiet --strict -c -) <<'FLEETSPEC_SHA256'\n{checks}\nFLEETSPEC_SHA256",
        f"rm -rf -- {q(dest)}",
        f"mv -- {q(tmp)} {q(dest)}",
    ]
    return "\n".join(lines) + "\n"

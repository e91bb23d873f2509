"""Shell builders for the file operations a deploy makes on a host, each atomic.

Every write lands in a temp name first and is renamed into place, so a crash or a cut link
leaves either the old file or the new one, never a torn one. All paths pass through shlex.quote.
"""

from __future__ import annotations

import shlex

q = shlex.quote
TMP_SUFFIX = ".fleetspec-tmp"


def read_optional(path: str, marker: str = "__FLEETSPEC_ABSENT__") -> str:
    """cat a file, or print a marker when it does not exist (one round trip, no error)."""
    return f"if [ -e {q(path)} ]; then cat {q(path)}; else printf %s {q(marker)}; fi"


def symlink_atomic(target: str, link: str) -> str:
    """Point `link` at `target` by renaming a fresh symlink over it (rename(2) is atomic)."""
    tmp = link + TMP_SUFFIX
    return f"ln -sfn {q(target)} {q(tmp)} && mv -Tf {q(tmp)} {q(link)}"


def remove(path: str) -> str:
    return f"rm -f {q(path)}"


def copy_atomic(src: str, dest: str, sha256: str | None = None) -> str:
    """Copy then rename, checking the copy's hash before it replaces anything."""
    tmp = dest + TMP_SUFFIX
    check = f" && echo {q(sha256 + '  ' + tmp)} | sha256sum -c --quiet" if sha256 else ""
    return f"cp -p {q(src)} {q(tmp)}{check} && mv -f {q(tmp)} {q(dest)}"


def append_line(path: str, line: str) -> str:
    """One write(2) with O_APPEND: lines under PIPE_BUF never interleave or tear. If the file
    ends in a torn line (a write cut short by ENOSPC or a crash), a newline goes first so the
    torn line stays alone (and is skipped by readers) instead of swallowing this one."""
    if "\n" in line:
        raise ValueError("a ledger line must not contain a newline")
    return (f"if [ -s {q(path)} ] && [ -n \"$(tail -c 1 {q(path)})\" ]; then printf '\\n' >> {q(path)}; fi; "
            f"printf '%s\\n' {q(line)} >> {q(path)}")


def sha256_of(paths: list[str]) -> str:
    """sha256sum of the paths that exist; absent ones are simply not listed."""
    if not paths:
        return "true"
    return "sha256sum -- " + " ".join(q(p) for p in paths) + " 2>/dev/null; true"


def parse_sha256sum(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        digest, _, path = line.partition("  ")
        if len(digest) == 64 and path:
            out[path] = digest
    return out


def missing_objects(store: str, digests: list[str]) -> str:
    """Which content-addressed objects the host lacks: prints one digest per line."""
    names = " ".join(q(d) for d in digests)
    return f"mkdir -p {q(store)} && for d in {names}; do [ -e {q(store)}/$d ] || echo $d; done"

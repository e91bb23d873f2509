"""Shell builders for the file operations a deploy makes on a host, each atomic and durable.

Every write lands in a temp name first and is renamed into place, so a crash or a cut link
leaves either the old file or the new one, never a torn one. Atomic is not durable: the temp
file's data is fsynced before the rename and the folder after it (`sync FILE`/`sync DIR` call
fsync(2) on each), as git and systemd do for their state, so a power cut cannot leave an empty
or old file behind a rename that was reported done. All paths pass through shlex.quote.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

from fleetspec.model.layout import STATE_ROOT

q = shlex.quote
TMP_SUFFIX = ".fleetspec-tmp"
RUN_DIR = str(STATE_ROOT / "run")     # root-only (0700): where remote python starts and scratch lives


def parent(path: str) -> str:
    return str(PurePosixPath(path).parent)


def fsync(*paths: str) -> str:
    """fsync(2) each path (a file's data, or a folder's entries); coreutils `sync` with operands."""
    return "sync -- " + " ".join(q(p) for p in paths)


def private_dir(path: str = RUN_DIR) -> str:
    """Make `path` a folder only root can enter (0700), whatever mode it had."""
    return f"mkdir -p -- {q(path)} && chmod 0700 -- {q(path)}"


def python_c(python: str, code: str, args=(), *, env: dict | None = None, rundir: str = RUN_DIR,
             timeout_s: int | None = None) -> str:
    """Run `python -c code args` as root without ever importing from a folder others can write.

    With -c, Python puts the current folder first on sys.path: started from /tmp (or a user's home
    under sudo), anyone's json.py or torch.py there would run as root. So: start in `rundir`, a
    root-only folder (or `/` when it cannot be made: a read-only /var), and set PYTHONSAFEPATH=1
    (Python >= 3.11's -P: the folder is not put on sys.path at all; older Pythons ignore it, where -P
    would be an error). PYTHONPATH and the rest of the environment are kept, unlike -I."""
    values = {"PYTHONSAFEPATH": "1", **(env or {})}
    assigns = " ".join(f"{k}={q(str(v))}" for k, v in values.items())
    timeout = f"timeout {int(timeout_s)} " if timeout_s else ""
    words = " ".join(q(str(a)) for a in args)
    return (f"{{ {private_dir(rundir)} && cd -- {q(rundir)}; }} 2>/dev/null || cd / && "
            f"{assigns} {timeout}{q(python)} -c {q(code)}{' ' + words if words else ''}")


def scratch_dir(rundir: str = RUN_DIR) -> str:
    """A fresh folder with an unpredictable name inside the root-only `rundir`; prints its path.
    (A fixed or guessable name in a shared folder could be made first, with a symlink inside.)"""
    return f"{private_dir(rundir)} && mktemp -d -- {q(rundir + '/scratch.XXXXXXXXXX')}"


def read_optional(path: str, marker: str = "__FLEETSPEC_ABSENT__") -> str:
    """cat a file, or print a marker when it does not exist (one round trip, no error)."""
    return f"if [ -e {q(path)} ]; then cat {q(path)}; else printf %s {q(marker)}; fi"


def symlink_atomic(target: str, link: str) -> str:
    """Point `link` at `target` by renaming a fresh symlink over it (rename(2) is atomic)."""
    tmp = link + TMP_SUFFIX
    return f"ln -sfn -- {q(target)} {q(tmp)} && mv -Tf -- {q(tmp)} {q(link)} && {fsync(parent(link))}"


def remove(path: str) -> str:
    return f"rm -f -- {q(path)}"


def remove_durable(path: str) -> str:
    """Remove and fsync the folder, so the file does not come back after a power cut."""
    return f"rm -f -- {q(path)} && {{ [ ! -d {q(parent(path))} ] || {fsync(parent(path))}; }}"


def copy_atomic(src: str, dest: str, sha256: str | None = None) -> str:
    """Copy then rename, checking the copy's hash before it replaces anything; data and folder fsynced."""
    tmp = dest + TMP_SUFFIX
    check = f" && printf '%s\\n' {q(sha256 + '  ' + tmp)} | sha256sum -c --quiet" if sha256 else ""
    return (f"cp -p -- {q(src)} {q(tmp)}{check} && {fsync(tmp)} && mv -f -- {q(tmp)} {q(dest)} && "
            f"{fsync(parent(dest))}")


def append_line(path: str, line: str) -> str:
    """One write(2) with O_APPEND: lines under PIPE_BUF never interleave or tear. If the file
    ends in a torn line (a write cut short by ENOSPC or a crash), a newline goes first so the
    torn line stays alone (and is skipped by readers) instead of swallowing this one. The file and
    its folder are fsynced after the write (the folder for a ledger the write created)."""
    if "\n" in line:
        raise ValueError("a ledger line must not contain a newline")
    return (f"if [ -s {q(path)} ] && [ -n \"$(tail -c 1 {q(path)})\" ]; then printf '\\n' >> {q(path)}; fi; "
            f"printf '%s\\n' {q(line)} >> {q(path)} && {fsync(path, parent(path))}")


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

"""The file operations a deploy makes on a host, each atomic and durable: shell builders, and
the functions that run them over a transport (`t`), one round trip each.

Every write lands in a temp name first and is renamed into place, so a crash or a cut link
leaves either the old file or the new one, never a torn one. Atomic is not durable: the temp
file's data is fsynced before the rename and the folder after it (`sync FILE`/`sync DIR` call
fsync(2) on each), as git and systemd do for their state, so a power cut cannot leave an empty
or old file behind a rename that was reported done. All paths pass through shlex.quote.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import PurePosixPath

from fleetspec.model.layout import STATE_ROOT
from fleetspec.remote.api import CommandResult, TransportLike

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


# in a fact's environment: its snippet may write its cache (a deploy's preflight); status and
# --plan start without it and write nothing on the host
KEEP_CACHE = {"FLEETSPEC_FACT_CACHE_KEEP": "1"}
UNTRUSTED = "FLEETSPEC-UNTRUSTED-PYTHON"
UNTRUSTED_RC = 87


def trusted_python(python: str, keep: bool = True) -> str:
    """Shell (a subshell: exit 0, or 87 with one UNTRUSTED line on stderr) that lets `python` run
    as root only when nobody but root can change what it runs at start: the interpreter (its real
    path), the venv around `python`, and its prefix's lib/python3* (stdlib, site-packages; a
    `.pth` or `sitecustomize` there runs at every start), each owned by root and not group- or
    world-writable, nor any folder above them (a sticky one excepted). A verdict is kept in
    RUN_DIR under a name made of those roots' inode, owner, mode and ctime: only root can make
    a trusted tree untrusted, and chown/chmod of a root changes its name. A missing interpreter
    passes: running it fails as it always did. `keep` False (status, --plan: nothing is written on
    the host): a kept verdict is read, none is written."""
    bad = (f"fs_bad() {{ printf '%s %s\\n' {UNTRUSTED} \"$fs_py runs as root, but $1 can be changed by others (owner "
           f"uid $2, mode $3): refusing to run it; make the interpreter, its venv and site-packages root's and not "
           f"group/world-writable (chown -R root, chmod -R go-w), or use such a venv in vars.python\" >&2; "
           f"exit {UNTRUSTED_RC}; }}")
    return (
        f"( fs_py={q(python)}; {bad}; "
        'fs_real=$(readlink -f -- "$fs_py") && [ -f "$fs_real" ] || exit 0; '
        'set -- "$fs_real"; fs_v=$(dirname -- "$(dirname -- "$fs_py")"); '
        '[ -f "$fs_v/pyvenv.cfg" ] && set -- "$@" "$(readlink -f -- "$fs_v")"; '
        'fs_b=$(dirname -- "$(dirname -- "$fs_real")"); '
        'for fs_d in "$fs_b"/lib/python3* "$fs_b"/local/lib/python3*; do [ -d "$fs_d" ] && set -- "$@" "$fs_d"; done; '
        f'fs_c={q(RUN_DIR)}/trusted-python.$(stat -L -c "%n %d:%i:%u:%a:%Z" -- "$@" | sha256sum | cut -c1-32); '
        '[ -e "$fs_c" ] && exit 0; '
        'for fs_d in "$@"; do fs_a=$fs_d; while :; do '
        'fs_s=$(stat -L -c "%u %a" -- "$fs_a") || fs_bad "$fs_a" "?" "?"; fs_u=${fs_s% *}; fs_m=${fs_s#* }; '
        '[ "$fs_u" = 0 ] || fs_bad "$fs_a" "$fs_u" "$fs_m"; '
        'if [ $(( 0$fs_m & 022 )) -ne 0 ] && { [ "$fs_a" = "$fs_d" ] || [ $(( 0$fs_m & 01000 )) -eq 0 ]; }; then '
        'fs_bad "$fs_a" "$fs_u" "$fs_m"; fi; [ "$fs_a" = / ] && break; fs_a=$(dirname -- "$fs_a"); done; '
        r'fs_f=$(find "$fs_d" -xdev \( ! -user 0 -o \( ! -type l -perm /022 \) \) -print -quit 2>/dev/null); '
        '[ -z "$fs_f" ] || fs_bad "$fs_f" $(stat -c "%u %a" -- "$fs_f"); done; '
        + (f'[ -d {q(RUN_DIR)} ] && : > "$fs_c" 2>/dev/null; ' if keep else "") + 'exit 0 )')


def python_c(python: str, code: str, args=(), *, env: dict | None = None, rundir: str = RUN_DIR,
             timeout_s: int | None = None, keep: bool = True) -> str:
    """Run `python -c code args` as root without ever importing from a folder others can write.

    With -c, Python puts the current folder first on sys.path: started from /tmp (or a user's home
    under sudo), anyone's json.py or torch.py there would run as root. So: start in `rundir`, a
    root-only folder (or `/` when it cannot be made: a read-only /var), and set PYTHONSAFEPATH=1
    (Python >= 3.11's -P: the folder is not put on sys.path at all; older Pythons ignore it, where -P
    would be an error). PYTHONPATH and the rest of the environment are kept, unlike -I. And only an
    interpreter whose tree only root can change (trusted_python; else exit 87, one line on stderr).
    One brace group, so a redirection after it covers the check too. `keep` False, for a reading
    that must write nothing on the host (status, --plan): started in `/` (root's too), no folder
    made, no trust verdict kept, no bytecode written (PYTHONDONTWRITEBYTECODE)."""
    values = {"PYTHONSAFEPATH": "1", **({} if keep else {"PYTHONDONTWRITEBYTECODE": "1"}), **(env or {})}
    assigns = " ".join(f"{k}={q(str(v))}" for k, v in values.items())
    timeout = f"timeout {int(timeout_s)} " if timeout_s else ""
    words = " ".join(q(str(a)) for a in args)
    start = f"{{ {private_dir(rundir)} && cd -- {q(rundir)}; }} 2>/dev/null || cd /" if keep else "cd /"
    return (f"{{ {start}; {trusted_python(python, keep)} && "
            f"{assigns} {timeout}{q(python)} -c {q(code)}{' ' + words if words else ''}; }}")


def scratch_dir(rundir: str = RUN_DIR) -> str:
    """A fresh folder with an unpredictable name inside the root-only `rundir`; prints its path.
    (A fixed or guessable name in a shared folder could be made first, with a symlink inside.)"""
    return f"{private_dir(rundir)} && mktemp -d -- {q(rundir + '/scratch.XXXXXXXXXX')}"


def read_optional(path: str, marker: str = "__FLEETSPEC_ABSENT__") -> str:
    """cat a file, or print a marker when it does not exist (one round trip, no error). Anything
    there that is not a regular file (a FIFO, /dev/zero through a link) is refused, not read."""
    return (f"if [ -f {q(path)} ]; then cat -- {q(path)}; elif [ -e {q(path)} ]; then "
            f"printf '%s\\n' {q(path + ': not a regular file; refusing to read it')} >&2; false; "
            f"else printf %s {q(marker)}; fi")


def symlink_atomic(target: str, link: str) -> str:
    """Point `link` at `target` by renaming a fresh symlink over it (rename(2) is atomic)."""
    tmp = link + TMP_SUFFIX
    return f"ln -sfn -- {q(target)} {q(tmp)} && mv -Tf -- {q(tmp)} {q(link)} && {fsync(parent(link))}"


def remove_script(path: str) -> str:
    return f"rm -f -- {q(path)}"


def remove_durable_script(path: str) -> str:
    """Remove and fsync the folder, so the file does not come back after a power cut."""
    return f"rm -f -- {q(path)} && {{ [ ! -d {q(parent(path))} ] || {fsync(parent(path))}; }}"


def copy_atomic(src: str, dest: str, sha256: str | None = None) -> str:
    """Copy then rename, checking the copy's hash before it replaces anything; data and folder
    fsynced. The copy is made in a fresh root-only folder beside `dest` (mktemp -d: a name no one
    can guess or make first, on the same file system for the rename), never at a fixed name that
    a link planted in site-packages could redirect; the folder goes whatever happens."""
    d = q(parent(dest))
    check = f" && printf '%s  %s\\n' {q(sha256 or '')} \"$fs_t/f\" | sha256sum -c --quiet" if sha256 else ""
    return (f"{{ fs_t=$(mktemp -d -- {d}/.fleetspec-tmp.XXXXXXXXXX) && "
            f"{{ cp -p -- {q(src)} \"$fs_t/f\"{check} && sync -- \"$fs_t/f\" && mv -f -- \"$fs_t/f\" {q(dest)} && "
            f"rmdir -- \"$fs_t\" && {fsync(parent(dest))} || {{ rm -rf -- \"$fs_t\"; false; }}; }}; }}")


def write_from_stdin(path: str, data: bytes, mode: int) -> str:
    """Write the next len(data) bytes of stdin to `path`: temp file, its sha256 checked (a short or
    misread stdin never lands), mode, fsync, rename. The caller fsyncs the folder (several at once)."""
    tmp = path + TMP_SUFFIX
    digest = hashlib.sha256(data).hexdigest()
    return (f"head -c {len(data)} > {q(tmp)} && printf '%s\\n' {q(digest + '  ' + tmp)} | sha256sum -c --quiet && "
            f"chmod {mode:o} -- {q(tmp)} && {fsync(tmp)} && mv -f -- {q(tmp)} {q(path)}")


def append_line(path: str, line: str) -> str:
    """One write(2) with O_APPEND: lines under PIPE_BUF never interleave or tear. If the file
    ends in a torn line (a write cut short by ENOSPC or a crash), a newline goes first so the
    torn line stays alone (and is skipped by readers) instead of swallowing this one. The file and
    its folder are fsynced after the write (the folder for a ledger the write created)."""
    if "\n" in line:
        raise ValueError("a ledger line must not contain a newline")
    return (f"if [ -s {q(path)} ] && [ -n \"$(tail -c 1 {q(path)})\" ]; then printf '\\n' >> {q(path)}; fi; "
            f"printf '%s\\n' {q(line)} >> {q(path)} && {fsync(path, parent(path))}")


def drop_lines_script(path: str, archive: str, ranges: list[tuple[int, int]]) -> str:
    """`path` without the line `ranges` (1-based, inclusive), the old file kept whole as `archive`
    (a hard link to its inode: nothing copied, nothing lost): the rest into a temp file, fsync,
    link, fsync, rename, fsync. Cut off at any point, every line is in `path` or in `archive`
    (or in both: readers of both drop repeats). Lines appended after the caller read the file
    come after the ranges and stay. An existing `archive` stops it before any change."""
    tmp = path + TMP_SUFFIX
    expr = ";".join(f"{a}d" if a == b else f"{a},{b}d" for a, b in ranges)
    return (f"umask 077 && mkdir -p -- {q(parent(archive))} && [ ! -e {q(archive)} ] && "
            f"sed -e {q(expr)} -- {q(path)} > {q(tmp)} && {fsync(tmp)} && ln -- {q(path)} {q(archive)} && "
            f"{fsync(parent(archive))} && mv -f -- {q(tmp)} {q(path)} && {fsync(parent(path))}")


def cat_files_script(pattern: str) -> str:
    """Print the files matching `pattern` (a folder's path and a glob in its last part), in the
    shell's sorted order, each followed by a newline; none is no error."""
    folder, glob = pattern.rsplit("/", 1)
    return f'for f in {q(folder)}/{glob}; do if [ -f "$f" ]; then cat -- "$f" && echo || exit; fi; done'


def list_files_script(pattern: str) -> str:
    """The files matching `pattern` (a folder's path and a glob in its last part), one per line,
    in the shell's sorted order; none is no error."""
    folder, glob = pattern.rsplit("/", 1)
    return f'for f in {q(folder)}/{glob}; do if [ -f "$f" ]; then printf "%s\\n" "$f"; fi; done; true'


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


# Run over a transport ----------------------------------------------------------------------------
ABSENT = "__FLEETSPEC_ABSENT__"


def sha256_map(t: TransportLike, paths, timeout: float = 60) -> dict[str, str]:
    """{path: sha256} of those of `paths` that exist on the host (absent ones left out)."""
    return parse_sha256sum(t.run_script(sha256_of(sorted(paths)), timeout=timeout, check=True).stdout)


def list_files(t: TransportLike, pattern: str) -> list[str]:
    return t.run_script(list_files_script(pattern), timeout=30, check=True).stdout.splitlines()


def read_text(t: TransportLike, path: str) -> str | None:
    """A file's text, or None when it does not exist."""
    text = t.run_script(read_optional(path, ABSENT), timeout=30, check=True).stdout
    return None if text == ABSENT else text


def readlink(t: TransportLike, path: str) -> str:
    """Where a symlink points ("" when it is not one or does not exist)."""
    return t.run_script(f"readlink -- {q(path)} || true", timeout=30, check=True).stdout.removesuffix("\n")


def is_file(t: TransportLike, path: str) -> bool:
    return t.run_script(f"test -f {q(path)}", timeout=30, check=False).rc == 0


def missing_paths(t: TransportLike, paths: list[str]) -> list[str]:
    """Those of `paths` that do not exist on the host (one a line: a path may hold a space)."""
    script = "; ".join(f"[ -e {q(p)} ] || echo {q(p)}" for p in paths)
    return t.run_script(script, timeout=30, check=False).stdout.splitlines()


def file_modes(t: TransportLike, paths: list[str]) -> dict[str, int]:
    """Permission bits of the files that exist among `paths`."""
    if not paths:
        return {}
    out = t.run_script("stat -c '%a %n' -- " + " ".join(q(p) for p in paths) + " 2>/dev/null; true",
                       timeout=30, check=True).stdout
    modes = {}
    for line in out.splitlines():
        bits, _, path = line.partition(" ")
        if path in paths and bits.isdigit():
            modes[path] = int(bits, 8)
    return modes


def rm_tree(t: TransportLike, path: str, timeout: float = 120, check: bool = True) -> None:
    t.run_script(f"rm -rf -- {q(path)}", timeout=timeout, check=check)


def make_scratch(t: TransportLike, rundir: str = RUN_DIR) -> str:
    """A fresh unguessable folder inside the root-only `rundir` (scratch_dir); returns its path,
    the last line printed (a login banner or warning may come first)."""
    lines = t.run_script(scratch_dir(rundir), timeout=30, check=True).stdout.strip().splitlines()
    return lines[-1] if lines else ""


def append_private_lines(t: TransportLike, folder: str, path: str, lines: list[str], guard: str = "") -> CommandResult:
    """Append lines (each its own append_line write, in order) to `path` in the root-only `folder`,
    made if needed, in one command. A `guard` (a shell test that must pass first, e.g. the lock's)
    makes a failure the caller's to read."""
    prefix = guard + "; " if guard else ""
    return t.run_script(prefix + append_lines_script(folder, path, lines), timeout=30, check=not guard)


PRELUDE_FAILED = 86      # reserved exit status: the prelude failed, the command itself never ran
PRELUDE_MARKER = "FLEETSPEC-LEDGER-PRELUDE-FAILED"


def prelude_script(guard: str, folder: str, path: str, lines: list[str]) -> str:
    """Shell to put in front of a command: `guard`, then the appends, in a subshell (its umask,
    stdin and stdout stay there); on failure the marker and its status on stderr, exit
    PRELUDE_FAILED, and the command after it never runs."""
    inner = (guard + "; " if guard else "") + append_lines_script(folder, path, lines)
    return f"( exec </dev/null >&2; {inner} ) || {{ echo {PRELUDE_MARKER} $? >&2; exit {PRELUDE_FAILED}; }}\n"


def append_lines_script(folder: str, path: str, lines: list[str]) -> str:
    """append_private_lines' shell (umask 077: run it in a subshell when more follows)."""
    appends = " && ".join(f"{{ {append_line(path, line)}; }}" for line in lines)
    return f"umask 077 && mkdir -p -- {q(folder)} && chmod 0700 -- {q(folder)} && " + appends


def fresh_private_tree(t: TransportLike, parent_dir: str, tmp: str, subdirs: tuple[str, ...] = ()) -> None:
    """An empty 0700 `tmp` (and its `subdirs`) inside the 0700 `parent_dir`, whatever was there."""
    made = " ".join(q(p) for p in (tmp, *(f"{tmp}/{d}" for d in subdirs)))
    t.run_script(f"umask 077 && mkdir -p -- {q(parent_dir)} && chmod 0700 -- {q(parent_dir)} && "
                 f"rm -rf -- {q(tmp)} && mkdir -m 0700 -- {made}", timeout=30, check=True)


def rename_into_place(t: TransportLike, tmp: str, final: str, *, replace: bool) -> None:
    """Rename the folder `tmp` to `final` and fsync their parent: a folder is whole or absent.
    `replace`: an existing `final` is moved aside first and removed after; else it must not exist."""
    base, old, folder = q(final), q(final + ".old"), q(parent(final))
    if replace:
        t.run_script(f"rm -rf -- {old}; if [ -d {base} ]; then mv -T -- {base} {old}; fi && "
                     f"mv -T -- {q(tmp)} {base} && sync -- {folder} && rm -rf -- {old}", timeout=30, check=True)
    else:
        t.run_script(f"[ ! -e {base} ] && mv -T -- {q(tmp)} {base} && sync -- {folder}", timeout=30, check=True)


def run_python(t: TransportLike, python: str, code: str, args=(), *, env: dict | None = None,
               rundir: str = RUN_DIR, timeout_s: int | None = None, timeout: float = 300,
               stdin: bytes | None = None) -> CommandResult:
    """`python -c code args` on the host as python_c builds it; the caller reads rc and output."""
    return t.run_script(python_c(python, code, args, env=env, rundir=rundir, timeout_s=timeout_s),
                        timeout=timeout, check=False, stdin=stdin)


def run_python_from_root(t: TransportLike, python: str, code: str, timeout_s: int = 300) -> CommandResult:
    """`python -c code` started in `/` with a `timeout`: for reading an installed package, where
    the root-only run folder is not needed (nothing is written: no trust verdict, no bytecode)."""
    return t.run_script(f"cd / && {trusted_python(python, keep=False)} && PYTHONDONTWRITEBYTECODE=1 "
                        f"timeout {int(timeout_s)} {q(python)} -c {q(code)}", timeout=timeout_s + 30, check=False)


def write_file(t: TransportLike, path: str, data: bytes, mode: int) -> None:
    """One file written from stdin (write_from_stdin) and its folder fsynced, in one command."""
    t.run_script(f"umask 077 && {write_from_stdin(path, data, mode)} && {fsync(parent(path))}", timeout=60,
                 check=True, stdin=data)

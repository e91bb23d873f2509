"""Unified diffs, parsed and applied with zero fuzz: every hunk at its stated line, every context
and removed line byte-equal to the base.

Written here rather than calling `patch --fuzz=0`: GNU patch still moves a hunk by an offset when
its line numbers are off, needs the tool on the controller, and reports failures as prose on
stdout; this applier is pure (bytes in, bytes out, testable offline), keeps "\\ No newline at end of
file" exact, and its refusal names the patch file, the hunk and the first line that differs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fleetspec.errors import ConfigError

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_EOL = b"\\ No newline at end of file"


@dataclass(frozen=True)
class Hunk:
    number: int            # 1-based, within its file
    header: str            # "@@ -107,7 +108,11 @@"
    old_start: int
    old: tuple[bytes, ...]   # context and removed lines, as in the base
    new: tuple[bytes, ...]   # context and added lines, as in the result


@dataclass(frozen=True)
class FilePatch:
    path: str              # relative to site-packages (the diff's b/ name, one component stripped)
    hunks: tuple[Hunk, ...]


def parse(data: bytes, source: Path | str) -> tuple[FilePatch, ...]:
    """The file sections of a unified diff; `source` names the diff in errors."""
    lines = data.splitlines(keepends=True)
    out: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(b"--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
            raise ConfigError(source, f"line {i + 1}", "a '+++ b/<path>' line after '--- a/<path>'")
        path = _header_path(lines[i], lines[i + 1], source, i + 1)
        hunks: list[Hunk] = []
        i += 2
        while i < len(lines) and lines[i].startswith(b"@@"):
            hunk, i = _hunk(lines, i, len(hunks) + 1, source, path)
            hunks.append(hunk)
        if not hunks:
            raise ConfigError(source, path, "at least one '@@ -l,s +l,s @@' hunk")
        out.append(FilePatch(path, tuple(hunks)))
    if not out:
        raise ConfigError(source, None, "a unified diff ('--- a/<path>', '+++ b/<path>', hunks)")
    return tuple(out)


def _header_path(old: bytes, new: bytes, source: Path | str, lineno: int) -> str:
    names = [line[4:].split(b"\t")[0].strip().decode("utf-8", "replace") for line in (old, new)]
    if "/dev/null" in names:
        raise ConfigError(source, f"line {lineno}", "a change to an existing file (new files go in the "
                          "patch folder's `add` list, not in a diff)")
    stripped = [n.split("/", 1)[1] if "/" in n else "" for n in names]
    if not stripped[1] or stripped[0] != stripped[1]:
        raise ConfigError(source, f"line {lineno}", f"'--- a/<path>' and '+++ b/<path>' naming one file, "
                          f"got {names[0]!r} and {names[1]!r}")
    return stripped[1]


def _hunk(lines: list[bytes], i: int, number: int, source: Path | str, path: str) -> tuple[Hunk, int]:
    m = _HUNK.match(lines[i])
    header = lines[i].split(b" @@")[0].decode("utf-8", "replace") + " @@"
    if not m:
        raise ConfigError(source, f"{path} hunk {number}", f"a '@@ -l,s +l,s @@' header, got {header!r}")
    old_start = int(m.group(1))
    want_old = int(m.group(2)) if m.group(2) is not None else 1
    want_new = int(m.group(4)) if m.group(4) is not None else 1
    old: list[bytes] = []
    new: list[bytes] = []
    last = b""
    i += 1
    while i < len(lines) and (len(old) < want_old or len(new) < want_new or lines[i].startswith(b"\\")):
        line = lines[i]
        tag, body = line[:1], line[1:]
        if line.rstrip(b"\r\n") == NO_EOL:
            _strip_eol(old if last == b"-" else new if last == b"+" else None, old, new)
        elif tag in (b" ", b"\n"):
            body = body if tag == b" " else b"\n"
            old.append(body)
            new.append(body)
        elif tag == b"-":
            old.append(body)
        elif tag == b"+":
            new.append(body)
        else:
            break
        last = tag
        i += 1
    if len(old) != want_old or len(new) != want_new:
        raise ConfigError(source, f"{path} hunk {number} ({header})",
                          f"{want_old} old and {want_new} new lines, got {len(old)} and {len(new)}")
    return Hunk(number, header, old_start, tuple(old), tuple(new)), i


def _strip_eol(which: list[bytes] | None, old: list[bytes], new: list[bytes]) -> None:
    for target in ((which,) if which is not None else (old, new)):
        if target:
            target[-1] = target[-1].rstrip(b"\n")


def apply(base: bytes, patch: FilePatch, source: Path | str) -> bytes:
    """`base` with every hunk applied at its own line; the first hunk that does not match is refused."""
    lines = base.splitlines(keepends=True)
    out: list[bytes] = []
    cursor = 0
    for hunk in patch.hunks:
        start = hunk.old_start - 1 if hunk.old else hunk.old_start
        where = f"{patch.path} hunk {hunk.number} ({hunk.header})"
        if start < cursor:
            raise ConfigError(source, where, f"hunks in line order (this one starts before line {cursor + 1})")
        have = lines[start:start + len(hunk.old)]
        if list(hunk.old) != have:
            raise ConfigError(source, where, _mismatch(hunk, have, start))
        out.extend(lines[cursor:start])
        out.extend(hunk.new)
        cursor = start + len(hunk.old)
    out.extend(lines[cursor:])
    return b"".join(out)


def _mismatch(hunk: Hunk, have: list[bytes], start: int) -> str:
    for k, want in enumerate(hunk.old):
        got = have[k] if k < len(have) else None
        if got != want:
            found = "the end of the file" if got is None else repr(_short(got))
            return (f"does not apply with zero fuzz: line {start + k + 1} of the base is {found}, "
                    f"the hunk expects {_short(want)!r}")
    return "does not apply with zero fuzz"


def _short(line: bytes) -> str:
    text = line.decode("utf-8", "replace").rstrip("\n")
    return text if len(text) <= 60 else text[:57] + "..."

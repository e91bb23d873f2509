"""Is a path an OpenSSH known_hosts file? Under `host_key_policy: accept-new` fleetspec appends a
`<host> <keytype> <key>` line to it; pointed at root's authorized_keys, that line (for a host named
`restrict`, or any line sshd reads as options) would let the host's key log in as root. So the
inventory's known_hosts is refused at load unless it is one: not named authorized_keys*, a regular
file where it exists (or /dev/null), and every line `[@marker] <hosts> <keytype> <base64 key> [comment]`."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass
from pathlib import Path

_KEY_TYPE = re.compile(r"(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9@.-]+|[a-z0-9-]+-cert-v01@openssh\.com)")
_MARKERS = ("@cert-authority", "@revoked")
MAX_BYTES = 16 * 1024 * 1024


def _key_line(fields: list[str]) -> bool:
    if fields and fields[0] in _MARKERS:
        fields = fields[1:]
    if len(fields) < 3 or not _KEY_TYPE.fullmatch(fields[1]) or '="' in fields[0]:
        return False
    try:
        blob = base64.b64decode(fields[2], validate=True)
        (n,) = struct.unpack(">I", blob[:4])
    except (binascii.Error, ValueError, struct.error):
        return False
    return blob[4:4 + n].decode("ascii", "replace") == fields[1]


def problem(path: Path) -> str | None:
    """Why `path` (resolved: a link is judged by what it names) is not a known_hosts file; None if it is."""
    if path.name.startswith("authorized_keys"):
        return f"{path} is an authorized_keys file, not a known_hosts file"
    if not path.exists() or str(path) == "/dev/null":     # /dev/null: nothing known, nothing kept
        return None
    if not path.is_file():
        return f"{path} is not a regular file"
    if path.stat().st_size > MAX_BYTES:
        return f"{path} is larger than {MAX_BYTES // (1024 * 1024)} MiB: not a known_hosts file"
    for n, line in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), 1):
        text = line.strip()
        if text and not text.startswith("#") and not _key_line(text.split()):
            return f"{path} line {n} is not a known_hosts line ([@marker] hosts keytype key)"
    return None


@dataclass(frozen=True)
class Marked:
    """A `@revoked` or `@cert-authority` line: paramiko reads neither (its parser takes the marker
    for a host name and fails on the key with a traceback), so fleetspec reads them here."""

    marker: str              # "@revoked" or "@cert-authority"
    hosts: str               # the line's host patterns, as written
    keytype: str
    key: str                 # base64, as written
    line: int


def split_marked(text: str) -> tuple[list[str], list[Marked]]:
    """The file's plain lines (for paramiko) and its marked lines."""
    plain: list[str] = []
    marked: list[Marked] = []
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if fields and fields[0] in _MARKERS:
            if len(fields) >= 4:
                marked.append(Marked(fields[0], fields[1], fields[2], fields[3], n))
            continue
        plain.append(line)
    return plain, marked


def host_matches(patterns: str, name: str) -> bool:
    """OpenSSH's rule for a known_hosts host field: comma-separated patterns (`*`, `?`, `[h]:port`,
    hashed `|1|salt|hash`), a `!pattern` that matches vetoes the line."""
    hit = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            try:
                _, _, salt, digest = pattern.split("|")
                mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
                found = hmac.compare_digest(mac, base64.b64decode(digest))
            except (ValueError, binascii.Error):
                found = False
        else:
            found = _glob(pattern).fullmatch(name) is not None
        if found and negated:
            return False
        hit = hit or found
    return hit


def _glob(pattern: str) -> re.Pattern[str]:
    """OpenSSH's wildcards: only `*` and `?` (brackets are literal, as in `[host]:port`)."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern),
                      re.IGNORECASE)

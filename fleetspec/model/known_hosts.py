"""Is a path an OpenSSH known_hosts file? Under `host_key_policy: accept-new` fleetspec appends a
`<host> <keytype> <key>` line to it; pointed at root's authorized_keys, that line (for a host named
`restrict`, or any line sshd reads as options) would let the host's key log in as root. So the
inventory's known_hosts is refused at load unless it is one: not named authorized_keys*, a regular
file where it exists (or /dev/null), and every line `[@marker] <hosts> <keytype> <base64 key> [comment]`."""

from __future__ import annotations

import base64
import binascii
import re
import struct
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

"""What a unit's `$VARIABLES` expand from on the host: the bytes of each EnvironmentFile= (each
glob's matches, in order) and the service manager's environment, in one command.

Globs are expanded by the host's sh with LC_ALL=C: the pattern sits in a variable expanded unquoted
with IFS empty, so it is only globbed (no word splitting, no `$`/backquote evaluation). A pattern
with no glob characters is tested as a path. Paths and contents travel base64-encoded, one line each.
The manager's environment comes from D-Bus as JSON (busctl), which quotes nothing the way
`systemctl show-environment` does; where busctl is missing the parser leaves it unread (None), and
fleetspec then refuses any variable the unit itself does not set.
"""

from __future__ import annotations

import base64
import binascii
import json
import shlex
from collections.abc import Sequence

from fleetspec.remote.facts.execenv import HostEnv

GLOB_CHARS = set("*?[")
BUSCTL = ("busctl --json=short get-property org.freedesktop.systemd1 /org/freedesktop/systemd1 "
          "org.freedesktop.systemd1.Manager Environment")


def command(patterns: Sequence[str] = ()) -> str:
    parts = ["LC_ALL=C; export LC_ALL",
             '_fs_one() { if [ -f "$2" ] && [ -r "$2" ] && _fs_b=$(base64 -w0 -- "$2"); then '
             'printf \'file %s %s %s\\n\' "$1" "$(printf %s "$2" | base64 -w0)" "$_fs_b"; '
             'else printf \'unreadable %s %s\\n\' "$1" "$(printf %s "$2" | base64 -w0)"; fi; }']
    for i, pattern in enumerate(patterns):
        q = shlex.quote(pattern)
        if GLOB_CHARS & set(pattern):
            parts.append(f"( _fs_p={q}; _fs_n=0; IFS=''; for _fs_f in $_fs_p; do "
                         f'[ -e "$_fs_f" ] || [ -L "$_fs_f" ] || continue; _fs_n=1; _fs_one {i} "$_fs_f"; done; '
                         f"[ $_fs_n = 1 ] || echo 'nomatch {i}' )")
        else:
            parts.append(f"if [ -e {q} ] || [ -L {q} ]; then _fs_one {i} {q}; else echo 'nomatch {i}'; fi")
    parts.append(f"_fs_m=$({BUSCTL} 2>/dev/null) && printf 'manager %s\\n' \"$_fs_m\"; true")
    return "\n".join(parts)


def parse(stdout: str, patterns: Sequence[str] = ()) -> HostEnv:
    found: dict[str, list[tuple[str, bytes | None]]] = {p: [] for p in patterns}
    manager = None
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "manager":
            manager = _manager(rest)
            continue
        words = rest.split(" ")
        if kind in ("file", "unreadable") and words[0].isdigit() and int(words[0]) < len(patterns):
            path = _b64(words[1]).decode("utf-8", "surrogateescape")
            data = _b64(words[2]) if kind == "file" else None
            found[patterns[int(words[0])]].append((path, data))
    return HostEnv(files={p: tuple(v) for p, v in found.items()}, manager=manager)


def _manager(text: str) -> dict[str, str] | None:
    try:
        data = json.loads(text).get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    env: dict[str, str] = {}
    for item in data:
        if isinstance(item, str) and "=" in item:
            name, _, value = item.partition("=")
            env[name] = value
    return env


def _b64(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as err:
        raise ValueError(f"environment file: not base64 ({err})") from None

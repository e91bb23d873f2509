"""The one strict pattern for every name fleetspec puts into a path, a unit name or a shell line.

Release ids, algos (playbook file names, which release ids carry), patch-set packages and kernel
file names become path parts on a host and words in generated shell: a name that could be `..`,
start with `-` (an option to rm/systemctl), or hold a quote, `$`, a newline or a backslash
(systemd's escape character) is refused where it is loaded, not quoted around later.
"""

from __future__ import annotations

import re
from typing import TypeGuard

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# A service: the same rule plus `@` and `:` (template instances), ending in .service. No `\`:
# systemd's `\xNN` escapes would let two spellings name one unit (and the guard's `%i` another folder).
SERVICE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,191}\.service")


def is_name(value: object) -> TypeGuard[str]:
    """A name safe as one path part and one shell word: letters, digits, `_ . -`, starting with a
    letter or digit (so never `.`, `..` or an option), no `..` inside, at most 128 characters."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None and ".." not in value


def is_service(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and SERVICE_RE.fullmatch(value) is not None and ".." not in value


def check_name(value: object, what: str) -> str:
    """`value` when it is a safe name; ValueError naming `what` otherwise."""
    if not is_name(value):
        raise ValueError(f"{what} must be letters, digits, '_', '.' or '-' starting with a letter or digit "
                         f"(no '..', at most 128), got {value!r}")
    return value


def relpath_problem(path: object) -> str | None:
    """Why `path` is not a plain relative path (no '', '.', '..' parts, no leading '-', no control
    characters or backslashes), or None when it is one."""
    if not isinstance(path, str) or not path or path.startswith("/"):
        return f"a non-empty relative path, got {path!r}"
    if "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        return f"a path without backslashes or control characters, got {path!r}"
    for part in path.split("/"):
        if part in ("", ".", "..") or part.startswith("-"):
            return f"a path without '', '.', '..' or '-…' parts, got {path!r}"
    return None

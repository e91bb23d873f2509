"""Rendering units and drop-ins (pure): one jinja2 environment and systemd's escaping rules.

systemd reads an ExecStart= word by unquoting "…" / '…', processing C escapes (\\n, \\xNN, \\\\, \\"),
then resolving `%` specifiers; `$` is expanded when the command runs. So one argv word becomes:
`%` -> `%%`, `$` -> `$$`, and when it holds whitespace, quotes, backslashes, control characters or
`;` (a lone `;` separates commands), the whole word in double quotes with C escapes inside.
fleetspec.remote.facts.unitfile parses the result back exactly; tests prove the round trip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import jinja2
from jinja2.sandbox import SandboxedEnvironment

_CONTROL_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}
_NEEDS_QUOTES = set(" \t\n\r\v\f\"'\\;")
EXEC_PREFIXES = "-@:+!"


def _is_control(ch: str) -> bool:
    return ord(ch) < 0x20 or ord(ch) == 0x7F


def _escape_specials(word: str) -> str:
    return word.replace("%", "%%").replace("$", "$$")


def _needs_quotes(text: str) -> bool:
    return not text or any(ch in _NEEDS_QUOTES or _is_control(ch) for ch in text)


def _c_quoted(text: str) -> str:
    """Double-quoted with C escapes, as systemd's extract_first_word(UNQUOTE|CUNESCAPE) reads it."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch in _CONTROL_ESCAPES:
            out.append(_CONTROL_ESCAPES[ch])
        elif _is_control(ch):
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def systemd_quote(arg: str) -> str:
    """One ExecStart= word that systemd turns back into exactly `arg` when the command runs."""
    if "\x00" in arg:
        raise ValueError("a NUL byte cannot be passed in argv")
    escaped = _escape_specials(arg)
    return _c_quoted(escaped) if _needs_quotes(arg) else escaped


def exec_line(argv: Iterable[str], prefix: str = "", path: str | None = None) -> str:
    """The value of an ExecStart= line for this argv, with the unit's prefix characters kept.

    With `@` the executable `path` is written first and argv[0] after it (a separate word); with
    `:` systemd expands no `$`, so `$` is written as is (only `%` is doubled).
    """
    argv = list(argv)
    if not argv:
        raise ValueError("empty argv")
    if set(prefix) - set(EXEC_PREFIXES) or "!!!" in prefix:
        raise ValueError(f"ExecStart prefix {prefix!r} is not made of {EXEC_PREFIXES}")
    words = ([path] if "@" in prefix else []) + argv
    if "@" in prefix and not path:
        raise ValueError("an @ prefix needs the executable path")
    exe = words[0]
    if exe[:1] in EXEC_PREFIXES or not exe:
        raise ValueError(f"executable {exe!r} must not be empty or start with one of {EXEC_PREFIXES}")
    quote = systemd_quote_noenv if ":" in prefix else systemd_quote
    return prefix + " ".join(quote(a) for a in words)


def systemd_quote_noenv(arg: str) -> str:
    """An ExecStart= word under the `:` prefix (no `$` expansion): `%` doubled, `$` kept."""
    if "\x00" in arg:
        raise ValueError("a NUL byte cannot be passed in argv")
    escaped = arg.replace("%", "%%")
    return _c_quoted(escaped) if _needs_quotes(arg) else escaped


def environment_line(name: str, value: str) -> str:
    """`Environment=` line for one variable (the assignment quoted as one word)."""
    if not name or not (name[0].isalpha() or name[0] == "_") or not all(c.isalnum() or c == "_" for c in name):
        raise ValueError(f"invalid environment variable name {name!r}")
    return "Environment=" + _quote_assignment(f"{name}={value}")


def _quote_assignment(text: str) -> str:
    # Environment= resolves specifiers but never expands `$`, so only `%` is doubled here.
    if "\x00" in text:
        raise ValueError("a NUL byte cannot be in the environment")
    text = text.replace("%", "%%")
    return _c_quoted(text) if _needs_quotes(text) else text


def oneline(value: object) -> str:
    """Text for a comment line: control characters (a newline would end the comment and start a
    directive or a command) become '?'."""
    return "".join("?" if _is_control(ch) else ch for ch in str(value))


def environment(root: str | Path | None = None) -> jinja2.Environment:
    """Templates from `<root>/templates/`; undefined names fail loudly (StrictUndefined). Sandboxed:
    a template reaches no Python internals (`__class__`, `__globals__` …), so one planted in a
    fleet root runs no code as the user who renders it (a SecurityError, exit 2)."""
    loader = jinja2.FileSystemLoader(str(Path(root) / "templates")) if root is not None else None
    env = SandboxedEnvironment(loader=loader, undefined=jinja2.StrictUndefined, autoescape=False,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["systemd_quote"] = systemd_quote
    env.filters["exec_line"] = exec_line
    env.filters["oneline"] = oneline
    env.globals["environment_line"] = environment_line
    return env


def render_string(template: str, context: Mapping) -> str:
    return environment().from_string(template).render(**context)

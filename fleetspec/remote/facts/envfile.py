"""The contents of an EnvironmentFile=, read as systemd 252's load_env_file reads them (pure).

src/basic/env-file.c parse_env_file_internal, character for character: `#`/`;` comment lines
(only where a key could start), `KEY=VALUE` lines (a line without `=` is skipped), `'…'` and
`"…"` values (in double quotes a backslash escapes only `"\\`$` and is kept before anything else;
an escaped newline is removed), a backslash outside quotes takes the next character literally and
`\\<newline>` continues the line, text after a closing quote joins the value, trailing unescaped
whitespace is chomped, an unclosed quote runs to the end of the file; invalid UTF-8 fails the
whole file; then strv_env_clean drops assignments with invalid names, and a later one wins.
"""

from __future__ import annotations

import re

from fleetspec.systemd_unit import UnitSyntaxError

WHITESPACE = " \t\n\r"
NEWLINE = "\n\r"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvFileError(UnitSyntaxError):
    """An EnvironmentFile= that systemd would refuse to load."""


def is_name(name: str) -> bool:
    return bool(_NAME.match(name))


def parse_env_file(data: bytes, path: str) -> dict[str, str]:
    """load_env_file + strv_env_clean: the file's valid assignments, a later one winning."""
    text = data.split(b"\x00", 1)[0]
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        raise EnvFileError(f"EnvironmentFile={path}: invalid UTF-8 (systemd refuses to load the file)") from None
    env: dict[str, str] = {}
    for key, value in _env_file_pairs(decoded):
        if is_name(key):
            env.pop(key, None)
            env[key] = value
    return env


def _env_file_pairs(text: str) -> list[tuple[str, str]]:
    """parse_env_file_internal's state machine, character for character."""
    reader = _Reader()
    for c in text:
        reader.state = getattr(reader, reader.state)(c)
    return reader.finish()


class _Reader:
    """One method per state of parse_env_file_internal; each takes a character, returns the next state."""

    def __init__(self) -> None:
        self.state = "pre_key"
        self.pairs: list[tuple[str, str]] = []
        self.key: list[str] = []
        self.value: list[str] = []
        self.key_ws: int | None = None       # where trailing whitespace of the key starts
        self.value_ws: int | None = None     # … of an unquoted value

    def push(self, chomp: bool) -> None:
        key = self.key[:self.key_ws] if self.key_ws is not None else self.key
        value = self.value[:self.value_ws] if chomp and self.value_ws is not None else self.value
        self.pairs.append(("".join(key), "".join(value)))
        self.key, self.value = [], []

    def finish(self) -> list[tuple[str, str]]:
        if self.state in ("pre_value", "in_value", "value_escape", "single", "double", "double_escape"):
            self.push(self.state == "in_value")
        return self.pairs

    def pre_key(self, c: str) -> str:
        if c in "#;":
            return "comment"
        if c in WHITESPACE:
            return "pre_key"
        self.key_ws = None
        self.key.append(c)
        return "in_key"

    def in_key(self, c: str) -> str:
        if c in NEWLINE:
            self.key = []
            return "pre_key"
        if c == "=":
            self.value_ws = None
            return "pre_value"
        if c not in WHITESPACE:
            self.key_ws = None
        elif self.key_ws is None:
            self.key_ws = len(self.key)
        self.key.append(c)
        return "in_key"

    def pre_value(self, c: str) -> str:
        if c in NEWLINE:
            self.push(False)
            return "pre_key"
        quoted = {"'": "single", '"': "double", "\\": "value_escape"}
        if c in quoted:
            return quoted[c]
        if c in WHITESPACE:
            return "pre_value"
        self.value.append(c)
        return "in_value"

    def in_value(self, c: str) -> str:
        if c in NEWLINE:
            self.push(True)
            return "pre_key"
        if c == "\\":
            self.value_ws = None
            return "value_escape"
        if c not in WHITESPACE:
            self.value_ws = None
        elif self.value_ws is None:
            self.value_ws = len(self.value)
        self.value.append(c)
        return "in_value"

    def value_escape(self, c: str) -> str:
        if c not in NEWLINE:
            self.value.append(c)
        return "in_value"

    def single(self, c: str) -> str:
        if c == "'":
            return "pre_value"
        self.value.append(c)
        return "single"

    def double(self, c: str) -> str:
        if c == '"':
            return "pre_value"
        if c == "\\":
            return "double_escape"
        self.value.append(c)
        return "double"

    def double_escape(self, c: str) -> str:
        if c in '"\\`$':
            self.value.append(c)
        elif c != "\n":
            self.value.extend(("\\", c))
        return "double"

    def comment(self, c: str) -> str:
        if c == "\\":
            return "comment_escape"
        return "pre_key" if c in NEWLINE else "comment"

    def comment_escape(self, c: str) -> str:
        return "comment"

"""systemd's unit-file syntax (pure), both ways: reading unit files as systemd 252 does, and
quoting argv words and assignments so that systemd reads back exactly what was meant.

Reading: `systemctl show` joins argv[] with plain spaces (systemctl-show.c: `strv_join(info.argv,
" ")`), so an argument holding a space cannot be told apart there; the unit file and its drop-ins
are the exact source. This follows load-fragment.c's config_parse_exec: words are split with
extract_first_word(UNQUOTE|CUNESCAPE), a lone unquoted `;` separates commands (`\\;` is a literal
`;`), leading `-@:+!` on the first word are flags, and `%%` is resolved per word; `$$` and `$VARIABLES`
are left for the exec step (facts.execenv expands them as systemd does), exactly as systemd stores it.

Writing: one argv word becomes `%` -> `%%`, `$` -> `$$`, and when it holds whitespace, quotes,
backslashes, control characters or `;`, the whole word in double quotes with C escapes inside;
tests prove the round trip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from fleetspec.errors import RemoteError

WHITESPACE = " \t\n\r"
_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
           "\\": "\\", '"': '"', "'": "'", "s": " "}


class UnitSyntaxError(RemoteError, ValueError):
    """Text that systemd would refuse (or that needs specifiers only systemd can resolve)."""


def _cunescape_one(text: str, i: int) -> tuple[str, int]:
    """The character of the escape that starts at text[i] (after the backslash); new index."""
    if i >= len(text):
        raise UnitSyntaxError("trailing backslash")
    c = text[i]
    if c in _SIMPLE:
        return _SIMPLE[c], i + 1
    if c == "x":
        digits = text[i + 1:i + 3]
        if len(digits) == 2 and all(d in "0123456789abcdefABCDEF" for d in digits):
            value = int(digits, 16)
            if value == 0:
                raise UnitSyntaxError("\\x00 is not allowed")
            return chr(value), i + 3
    if c in "uU":
        n = 4 if c == "u" else 8
        digits = text[i + 1:i + 1 + n]
        if len(digits) == n and all(d in "0123456789abcdefABCDEF" for d in digits):
            value = int(digits, 16)
            if value == 0 or value > 0x10FFFF:
                raise UnitSyntaxError(f"bad \\{c} escape")
            return chr(value), i + 1 + n
    if c in "01234567":
        digits = text[i:i + 3]
        if len(digits) == 3 and all(d in "01234567" for d in digits):
            value = int(digits, 8)
            if value == 0 or value > 0o377:
                raise UnitSyntaxError("bad octal escape")
            return chr(value), i + 3
    raise UnitSyntaxError(f"unknown escape \\{c}")


def extract_word(text: str, i: int) -> tuple[str | None, int]:
    """extract_first_word(UNQUOTE|CUNESCAPE): the next word from text[i:] and the new index."""
    n = len(text)
    while i < n and text[i] in WHITESPACE:
        i += 1
    if i >= n:
        return None, i
    out: list[str] = []
    quote = None
    while i < n:
        c = text[i]
        if quote is None and c in WHITESPACE:
            break
        if c == quote or (quote is None and c in "\"'"):   # a quote closes, or one opens outside quotes
            quote = None if c == quote else c
            i += 1
        elif c == "\\":
            ch, i = _cunescape_one(text, i + 1)
            out.append(ch)
        else:
            out.append(c)
            i += 1
    if quote:
        raise UnitSyntaxError("unbalanced quotes")
    return "".join(out), i


def resolve_specifiers(word: str, specifiers: dict[str, str] | None = None) -> str:
    """`%%` -> `%`; other specifiers from `specifiers`, else UnitSyntaxError (only systemd knows)."""
    specifiers = specifiers or {}
    out, i = [], 0
    while i < len(word):
        c = word[i]
        if c == "%":
            if i + 1 >= len(word):
                raise UnitSyntaxError("trailing %")
            s = word[i + 1]
            if s == "%":
                out.append("%")
            elif s in specifiers:
                out.append(specifiers[s])
            else:
                raise UnitSyntaxError(f"specifier %{s} needs the unit's context")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class ExecCommand:
    path: str
    argv: tuple[str, ...]
    flags: str = ""  # the prefix characters, e.g. "-" for ignore_errors
    variables: tuple[tuple[str, Any], ...] = ()   # each $VARIABLE expanded and where its value came from (execenv.EnvSource)


def parse_exec(value: str, specifiers: dict[str, str] | None = None) -> list[ExecCommand]:
    """The commands of one ExecStart= value, argv as systemd stores it (`$$` not yet expanded)."""
    commands: list[ExecCommand] = []
    i, n = 0, len(value)
    while True:
        first, i = extract_word(value, i)
        if first is None:
            break
        word0 = first.lstrip("-@:+!")
        flags = first[:len(first) - len(word0)]
        path = resolve_specifiers(word0, specifiers)
        if not path:
            raise UnitSyntaxError("empty executable")
        argv = [path]
        if "@" in flags:
            nxt, i = extract_word(value, i)
            if nxt is None:
                raise UnitSyntaxError("@ without argv[0]")
            argv = [resolve_specifiers(nxt, specifiers)]
        while True:
            j = i
            while j < n and value[j] in WHITESPACE:
                j += 1
            if j >= n:
                i = j
                break
            if value[j] == ";" and (j + 1 >= n or value[j + 1] in WHITESPACE):
                i = j + 1
                break
            if value[j:j + 2] == "\\;" and (j + 2 >= n or value[j + 2] in WHITESPACE):
                argv.append(";")
                i = j + 2
                continue
            word, i = extract_word(value, j)
            assert word is not None  # value[j] is neither whitespace nor the end
            argv.append(resolve_specifiers(word, specifiers))
        commands.append(ExecCommand(path=path, argv=tuple(argv), flags=flags))
    return commands


_VAR = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def expand_dollars(argv: tuple[str, ...] | list[str]) -> tuple[list[str], bool]:
    """(argv as the process gets it when no variables are referenced: `$$` -> `$`, uses_variables);
    with variables, only systemd (or facts.execenv) knows the values: the argv is approximate."""
    out, uses = [], False
    for word in argv:
        pieces, i = [], 0
        while i < len(word):
            if word.startswith("$$", i):
                pieces.append("$")
                i += 2
            elif word[i] == "$" and (m := _VAR.match(word, i)):
                uses = True
                pieces.append(m.group(0))
                i = m.end()
            else:
                pieces.append(word[i])
                i += 1
        out.append("".join(pieces))
    return out, uses


@dataclass
class UnitFile:
    """Assignments per section in file order (a key may repeat; empty values reset lists)."""

    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def values(self, section: str, key: str) -> list[str]:
        return [v for k, v in self.sections.get(section, []) if k == key]


def parse_unit(text: str) -> UnitFile:
    """Sections and key=value assignments; `#`/`;` comment lines; a trailing `\\` continues."""
    unit = UnitFile()
    section = None
    # systemd's read_line() ends lines at \n, \r, \r\n or NUL only (str.splitlines would also
    # split at \x85, \u2028, \v …), and strstrip() trims WHITESPACE only.
    lines = re.split(r"\r\n|\r|\n|\x00", text)
    i = 0
    while i < len(lines):
        line = lines[i].strip(WHITESPACE)
        i += 1
        if not line or line[0] in "#;":
            continue
        while _odd_trailing_backslash(line):
            line = line[:-1] + " "
            while i < len(lines):
                nxt = lines[i].strip(WHITESPACE)
                i += 1
                if nxt and nxt[0] in "#;":
                    continue
                line += nxt
                break
            else:
                break
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.sections.setdefault(section, [])
            continue
        if section is None or "=" not in line:
            raise UnitSyntaxError(f"not an assignment: {line[:60]!r}")
        key, _, value = line.partition("=")
        unit.sections[section].append((key.strip(WHITESPACE), value.strip(WHITESPACE)))
    return unit


def _odd_trailing_backslash(line: str) -> bool:
    stripped = line.rstrip("\\")
    return (len(line) - len(stripped)) % 2 == 1


def exec_start_of(unit_texts: list[str], specifiers: dict[str, str] | None = None) -> list[ExecCommand]:
    """The effective ExecStart= of a unit file followed by its drop-ins (in systemd's order):
    an empty `ExecStart=` clears what came before."""
    commands: list[ExecCommand] = []
    for text in unit_texts:
        for value in parse_unit(text).values("Service", "ExecStart"):
            if value == "":
                commands = []
            else:
                commands.extend(parse_exec(value, specifiers))
    return commands


def effective_environment(unit_text: str, dropin_texts: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """Environment= of a unit file and its drop-ins in order, less UnsetEnvironment= (environment_of)."""
    return environment_of([unit_text, *dropin_texts])


class NeedsHostEnvironment(UnitSyntaxError):
    """ExecStart= uses $VARIABLES: its argv needs the host's EnvironmentFile= contents (execenv)."""


def effective_exec_command(unit_text: str, dropin_texts: list[str] | tuple[str, ...] = (),
                           specifiers: dict[str, str] | None = None) -> ExecCommand:
    """The one ExecStart= command the service runs: prefix flags, the executable path (argv[0] but
    with `@`), the argv the process gets (`$$` expanded, not under `:`). UnitSyntaxError: no or several
    commands; NeedsHostEnvironment: `$VARIABLES` (facts.execenv.effective_exec_command expands them)."""
    commands = exec_start_of([unit_text, *dropin_texts], specifiers)
    if len(commands) != 1:
        raise UnitSyntaxError(f"expected exactly one ExecStart= command, found {len(commands)}")
    command = commands[0]
    if ":" in command.flags:
        return command
    argv, uses_vars = expand_dollars(command.argv)
    if uses_vars:
        raise NeedsHostEnvironment("ExecStart= uses $VARIABLES; its argv needs the host's environment files")
    return ExecCommand(path=command.path, argv=tuple(argv), flags=command.flags)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def environment_of(unit_texts: list[str], specifiers: dict[str, str] | None = None) -> dict[str, str]:
    """The Environment= of a unit file followed by its drop-ins, as systemd 252 builds it
    (config_parse_environ): each value split into words with extract_first_word(UNQUOTE|CUNESCAPE),
    `%%` resolved, `NAME=VALUE` words kept (a later one wins), an empty `Environment=` resets the
    list; a word systemd would reject is skipped as it does; UnsetEnvironment= names are removed.
    EnvironmentFile= is not read."""
    env: dict[str, str] = {}
    unset: set[str] = set()
    for text in unit_texts:
        try:
            unit = parse_unit(text)
        except UnitSyntaxError:
            continue
        for value in unit.values("Service", "UnsetEnvironment"):
            unset.update(word.partition("=")[0] for word in value.split())   # applied last, as exec does
        for value in unit.values("Service", "Environment"):
            if value == "":
                env = {}
                continue
            i = 0
            while True:
                try:
                    word, i = extract_word(value, i)
                except UnitSyntaxError:
                    break
                if word is None:
                    break
                try:
                    word = resolve_specifiers(word, specifiers)
                except UnitSyntaxError:
                    pass                      # a specifier only systemd can resolve: kept as written
                name, sep, val = word.partition("=")
                if sep and _ENV_NAME.match(name):
                    env[name] = val
    return {k: v for k, v in env.items() if k not in unset}


# Writing: the control characters with a one-letter C escape, the inverse of _SIMPLE's.
_CONTROL_ESCAPES = {v: "\\" + k for k, v in _SIMPLE.items() if k in "abfnrtv"}
_NEEDS_QUOTES = set(" \t\n\r\v\f\"'\\;")
EXEC_PREFIXES = "-@:+!"


def _is_control(ch: str) -> bool:
    return ord(ch) < 0x20 or ord(ch) == 0x7F


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


def _quote(text: str, dollars: bool, what: str = "passed in argv") -> str:
    """One word: `%` doubled (specifiers), `$` doubled where systemd would expand it, quoted when needed."""
    if "\x00" in text:
        raise ValueError(f"a NUL byte cannot be {what}")
    escaped = text.replace("%", "%%")
    escaped = escaped.replace("$", "$$") if dollars else escaped
    return _c_quoted(escaped) if _needs_quotes(text) else escaped


def systemd_quote(arg: str) -> str:
    """One ExecStart= word that systemd turns back into exactly `arg` when the command runs."""
    return _quote(arg, dollars=True)


def exec_line(argv: Iterable[str], prefix: str = "", path: str | None = None) -> str:
    """The value of an ExecStart= line for this argv, the unit's prefix characters kept. With `@` the
    executable `path` comes first, argv[0] after it; with `:` systemd expands no `$` (only `%` doubled)."""
    argv = list(argv)
    if not argv:
        raise ValueError("empty argv")
    if set(prefix) - set(EXEC_PREFIXES) or "!!!" in prefix:
        raise ValueError(f"ExecStart prefix {prefix!r} is not made of {EXEC_PREFIXES}")
    if "@" in prefix and not path:
        raise ValueError("an @ prefix needs the executable path")
    words = ([path] if path and "@" in prefix else []) + argv
    exe = words[0]
    if exe[:1] in EXEC_PREFIXES or not exe:
        raise ValueError(f"executable {exe!r} must not be empty or start with one of {EXEC_PREFIXES}")
    quote = systemd_quote_noenv if ":" in prefix else systemd_quote
    return prefix + " ".join(quote(a) for a in words)


def systemd_quote_noenv(arg: str) -> str:
    """An ExecStart= word under the `:` prefix (no `$` expansion): `%` doubled, `$` kept."""
    return _quote(arg, dollars=False)


def environment_line(name: str, value: str) -> str:
    """`Environment=` line for one variable (the assignment quoted as one word)."""
    if not _ENV_NAME.match(name):
        raise ValueError(f"invalid environment variable name {name!r}")
    # Environment= resolves specifiers but never expands `$`: only `%` is doubled.
    return "Environment=" + _quote(f"{name}={value}", dollars=False, what="in the environment")


def oneline(value: object) -> str:
    """Text for a comment line: control characters (a newline would end the comment and start a
    directive or a command) become '?'."""
    return "".join("?" if _is_control(ch) else ch for ch in str(value))

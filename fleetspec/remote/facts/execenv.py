"""ExecStart's `$VARIABLES`, expanded as systemd 252 expands them when the command runs (pure).

The rules, from systemd 252's own code (src/basic/env-util.c, src/basic/env-file.c,
src/core/execute.c, src/core/load-fragment.c):

- replace_env_argv: a word that starts with `$` and whose second character is neither `{` nor
  `$` is a variable *as a whole word*: everything after the `$` is the name (`$FOO.x` looks up
  `FOO.x`, a lone `$` looks up the empty name); its value is split on whitespace with quotes
  removed and backslashes escaping the next character (extract_first_word RELAX|UNQUOTE), into
  zero or more arguments; an unset variable drops the word. Every other word goes through
  replace_env: `${NAME}` is replaced by the value as is (one argument; unset: empty), `$$` is a
  literal `$`, any other `$` stays; `${NAME:…}` and an unclosed `${` are left as written.
- The environment the command sees (exec_child): the manager's environment, then what systemd
  sets per service (HOME, USER, INVOCATION_ID …), PassEnvironment=, Environment=, then
  EnvironmentFile= (files override Environment=, whatever their order in the unit); invalid
  assignments dropped; UnsetEnvironment= applied last.
- EnvironmentFile= (config_parse_unit_env_file, exec_context_load_environment): the whole value is
  one absolute path (globs allowed); a leading `-` makes a missing or unreadable file harmless;
  a required file that is missing makes the start fail. Its contents: facts.envfile.

Anything whose value only systemd knows (a variable systemd sets per service, a PassEnvironment=
name, a specifier) is refused: fleetspec must know every argument exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetspec import systemd_unit
from fleetspec.remote.facts.envfile import EnvFileError, is_name, parse_env_file
from fleetspec.systemd_unit import ExecCommand, UnitSyntaxError, extract_word, parse_unit, resolve_specifiers

WHITESPACE = " \t\n\r"
# What systemd itself puts into a service's environment (execute.c build_environment, service.c
# service_spawn; MONITOR_* only for OnFailure= units): their values are only known at start.
SYSTEMD_SET = frozenset({
    "HOME", "USER", "LOGNAME", "SHELL", "INVOCATION_ID", "JOURNAL_STREAM", "LISTEN_PID", "LISTEN_FDS",
    "LISTEN_FDNAMES", "WATCHDOG_PID", "WATCHDOG_USEC", "TERM", "LOG_NAMESPACE", "SYSTEMD_EXEC_PID",
    "SYSTEMD_NSS_DYNAMIC_BYPASS", "CREDENTIALS_DIRECTORY", "RUNTIME_DIRECTORY", "STATE_DIRECTORY",
    "CACHE_DIRECTORY", "LOGS_DIRECTORY", "CONFIGURATION_DIRECTORY", "NOTIFY_SOCKET", "MAINPID",
    "MANAGERPID", "REMOTE_ADDR", "REMOTE_PORT", "SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS"})


# Splitting and substitution -----------------------------------------------------------------------
def split_value(value: str) -> list[str]:
    """A `$NAME` word's value as the arguments it becomes (strv_split_full, RELAX|UNQUOTE)."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        out: list[str] = []
        quote = ""
        while i < n:
            c = value[i]
            if c == "\\":
                if i + 1 < n:
                    out.append(value[i + 1])
                i += 2
            elif quote:
                if c != quote:
                    out.append(c)
                else:
                    quote = ""
                i += 1
            elif c in "'\"":
                quote = c
                i += 1
            elif c in WHITESPACE:
                break
            else:
                out.append(c)
                i += 1
        words.append("".join(out))


Lookup = Callable[[str], "str | None"]


def replace_env(word: str, lookup: Lookup) -> str:
    """replace_env(word, env, 0): `${NAME}` substituted, `$$` -> `$`, everything else kept."""
    out: list[str] = []
    state, start = "word", 0
    for i, c in enumerate(word):
        if state == "word":
            if c == "$":
                state = "curly"
        elif state == "curly":
            if c == "{":
                out.append(word[start:i - 1])
                start, state = i - 1, "variable"
            elif c == "$":
                out.append(word[start:i])
                start, state = i + 1, "word"
            else:
                state = "word"
        elif c == "}":
            out.append(lookup(word[start + 2:i]) or "")
            start, state = i + 1, "word"
        elif c == ":":
            state = "word"        # ${NAME:-x}: syntax systemd 252 does not expand here; kept as written
    out.append(word[start:])
    return "".join(out)


def replace_env_argv(argv: Sequence[str], lookup: Lookup) -> list[str]:
    """The argv the process gets (replace_env_argv)."""
    out: list[str] = []
    for word in argv:
        if word.startswith("$") and word[1:2] not in ("{", "$"):
            value = lookup(word[1:])
            if value is not None:
                out.extend(split_value(value))
            continue
        out.append(replace_env(word, lookup))
    return out


def referenced(argv: Sequence[str]) -> list[str]:
    """Every name the expansion of `argv` looks up, in order, once each."""
    seen: dict[str, None] = {}

    def note(name: str) -> None:
        seen.setdefault(name)

    replace_env_argv(argv, lambda name: note(name))
    return list(seen)


def uses_variables(argv: Sequence[str]) -> bool:
    """True when a lookup could find a value (a name that can never be set, such as the empty one
    of a lone `$` word, is unset everywhere: no environment is needed to expand it)."""
    return any(is_name(name) or "=" in name for name in referenced(argv))


# The unit's environment settings ------------------------------------------------------------------
@dataclass(frozen=True)
class ExecEnvSettings:
    """What a unit file and its drop-ins say about the command's environment."""

    environment: tuple[tuple[str, str], ...] = ()     # Environment=, as config_parse_environ builds it
    unresolved: frozenset[str] = frozenset()          # … whose value holds a specifier only systemd resolves
    env_files: tuple[str, ...] = ()                   # EnvironmentFile= values, `-` kept, in order
    unset: tuple[str, ...] = ()                       # UnsetEnvironment= (NAME or NAME=VALUE)
    pass_env: tuple[str, ...] = ()                    # PassEnvironment=
    exec_search_path: bool = False                    # ExecSearchPath= sets PATH


def _words(value: str, specifiers: Mapping[str, str] | None) -> Iterable[tuple[str, bool]]:
    """Words of a list setting (extract_first_word UNQUOTE|CUNESCAPE) and whether their
    specifiers resolved; a syntax error ends the line as systemd does ("ignoring")."""
    i = 0
    while True:
        try:
            word, i = extract_word(value, i)
        except UnitSyntaxError:
            return
        if word is None:
            return
        try:
            yield resolve_specifiers(word, dict(specifiers or {})), True
        except UnitSyntaxError:
            yield word, False


def exec_env_settings(unit_texts: Sequence[str], specifiers: Mapping[str, str] | None = None) -> ExecEnvSettings:
    """The [Service] environment settings of a unit file followed by its drop-ins, in order; an
    empty assignment resets each list, as systemd does."""
    env: dict[str, str] = {}
    unresolved: set[str] = set()
    lists: dict[str, list[str]] = {"EnvironmentFile": [], "UnsetEnvironment": [], "PassEnvironment": []}
    search = False
    for text in unit_texts:
        for key, value in parse_unit(text).sections.get("Service", []):
            if key == "Environment":
                if value == "":
                    env, unresolved = {}, set()
                for word, resolved in _words(value, specifiers):
                    name, sep, val = word.partition("=")
                    if sep and is_name(name):
                        env.pop(name, None)
                        env[name] = val
                        (unresolved.discard if resolved else unresolved.add)(name)
            elif key == "EnvironmentFile":
                lists[key] = [] if value == "" else [*lists[key], value]
            elif key in ("UnsetEnvironment", "PassEnvironment"):
                lists[key] = [] if value == "" else [*lists[key], *(w for w, _ in _words(value, specifiers))]
            elif key == "ExecSearchPath":
                search = value != ""
    return ExecEnvSettings(tuple(env.items()), frozenset(unresolved), tuple(lists["EnvironmentFile"]),
                           tuple(lists["UnsetEnvironment"]), tuple(lists["PassEnvironment"]), search)


def env_file_path(value: str, specifiers: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """(the simplified absolute path or glob, optional?) of one EnvironmentFile= value; refuses
    what systemd ignores or cannot be resolved here."""
    try:
        resolved = resolve_specifiers(value, dict(specifiers or {}))
    except UnitSyntaxError as err:
        raise UnitSyntaxError(f"EnvironmentFile={value}: {err}") from None
    optional = resolved.startswith("-")
    path = resolved[1:] if optional else resolved
    if not path.startswith("/"):
        raise UnitSyntaxError(f"EnvironmentFile={value}: not an absolute path (systemd ignores the line); "
                              f"fix or remove it")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnitSyntaxError(f"EnvironmentFile={value}: not a normalized path (systemd ignores the line); "
                              f"fix or remove it")
    return "/" + "/".join(parts), optional


# Resolution -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnvSource:
    """Where a variable's value comes from: `value` None is unset (known: empty or dropped);
    `known` False: only systemd knows it (refused when used)."""

    value: str | None
    source: str
    known: bool = True


@dataclass(frozen=True)
class HostEnv:
    """What the host holds: each EnvironmentFile= pattern's matches ((path, bytes or None when
    unreadable), empty: no match) and the manager's environment (None: not read)."""

    files: Mapping[str, tuple[tuple[str, bytes | None], ...]] = field(default_factory=dict)
    manager: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Expansion:
    argv: tuple[str, ...]
    used: tuple[tuple[str, EnvSource], ...]     # every variable looked up, with where its value came from


def env_file_patterns(unit_texts: Sequence[str], specifiers: Mapping[str, str] | None = None) -> list[str]:
    """The paths (or globs) the host must read for the unit's EnvironmentFile= lines."""
    return list(dict.fromkeys(env_file_path(v, specifiers)[0] for v in exec_env_settings(unit_texts).env_files))


def _files_env(settings: ExecEnvSettings, host: HostEnv, specifiers: Mapping[str, str] | None) -> dict[str, EnvSource]:
    """exec_context_load_environment: every file in order, each glob's matches in order; a
    later assignment wins; a required file that is missing, unreadable or invalid is refused."""
    env: dict[str, EnvSource] = {}
    for raw in settings.env_files:
        pattern, optional = env_file_path(raw, specifiers)
        matches = host.files.get(pattern)
        if matches is None:
            raise EnvFileError(f"EnvironmentFile={raw}: not read from the host")
        if not matches and not optional:
            raise EnvFileError(f"EnvironmentFile={raw}: no such file (systemd would refuse to start the service; "
                               f"write it, or mark it optional with a leading '-')")
        for path, data in matches:
            if data is None:
                if optional:
                    continue
                raise EnvFileError(f"EnvironmentFile={raw}: {path} cannot be read (systemd would refuse to start "
                                   f"the service)")
            try:
                parsed = parse_env_file(data, path)
            except EnvFileError:
                if optional:
                    continue
                raise
            for name, value in parsed.items():
                env.pop(name, None)
                env[name] = EnvSource(value, f"EnvironmentFile={path}")
    return env


def accumulate(settings: ExecEnvSettings, host: HostEnv,
               specifiers: Mapping[str, str] | None = None) -> tuple[dict[str, EnvSource], EnvSource]:
    """The command's environment as exec_child builds it (strv_env_merge of every layer, then
    UnsetEnvironment=), and what a name set by none of them is."""
    acc: dict[str, EnvSource] = {}
    if host.manager is None:
        default = EnvSource(None, "is not set by the unit, and the manager's environment was not read", False)
    else:
        default = EnvSource(None, "unset")
        acc.update((k, EnvSource(v, "the manager's environment (systemctl show-environment)"))
                   for k, v in host.manager.items())
    for name in SYSTEMD_SET:
        acc[name] = EnvSource(None, "is set by systemd when the service starts", False)
    if settings.exec_search_path:
        acc["PATH"] = EnvSource(None, "is set by ExecSearchPath=", False)
    for name in settings.pass_env:
        acc[name] = EnvSource(None, "comes from the service manager's own environment (PassEnvironment=)", False)
    for name, value in settings.environment:
        acc[name] = (EnvSource(None, "is set by Environment= with a specifier only systemd resolves", False)
                     if name in settings.unresolved else EnvSource(value, "Environment="))
    acc.update(_files_env(settings, host, specifiers))
    for pattern in settings.unset:          # NAME=VALUE against a value only systemd knows: still unknown
        name, sep, value = pattern.partition("=")
        have = acc.get(name)
        if not sep or (have is not None and have.known and have.value == value):
            acc[name] = EnvSource(None, "UnsetEnvironment=")
    return acc, default


def service_environment(unit_texts: Sequence[str], host: HostEnv,
                        specifiers: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables the service's process starts with, as exec_child builds them: the manager's
    environment, Environment=, EnvironmentFile= (each file's contents), less UnsetEnvironment=.
    A name whose value only systemd knows (PassEnvironment=, a specifier) is there with '' (its
    name is what a check needs); systemd's own per-service names are left out. EnvFileError
    (a UnitSyntaxError) for a required file that is missing or unreadable."""
    acc, _ = accumulate(exec_env_settings(unit_texts, specifiers), host, specifiers)
    return {name: src.value or "" for name, src in acc.items()
            if name not in SYSTEMD_SET and (src.value is not None or not src.known)}


def expand(argv: Sequence[str], settings: ExecEnvSettings, host: HostEnv,
           specifiers: Mapping[str, str] | None = None) -> Expansion:
    """argv as the process gets it; UnitSyntaxError naming the variable when a value it needs is
    one only systemd knows."""
    acc, default = accumulate(settings, host, specifiers)
    used: dict[str, EnvSource] = {}

    def lookup(name: str) -> str | None:
        if "=" in name:
            raise UnitSyntaxError(f"ExecStart= looks up the name {name!r} (with '='), which fleetspec does not expand")
        if name in acc:
            got = acc[name]
        elif name == "" or not is_name(name):
            got = EnvSource(None, "not a variable name")
        elif name.startswith("MONITOR_"):
            got = EnvSource(None, "is set by systemd for OnFailure= units", False)
        else:
            got = default
        used.setdefault(name, got)
        if not got.known:
            shown = f"${{{name}}}" if name else "$"
            raise UnitSyntaxError(f"ExecStart= uses {shown}, which {got.source}; fleetspec cannot know its value")
        return got.value

    return Expansion(tuple(replace_env_argv(argv, lookup)), tuple(used.items()))


def effective_exec_command(unit_text: str, dropin_texts: Sequence[str] = (), specifiers: dict[str, str] | None = None,
                           env: HostEnv | None = None) -> ExecCommand:
    """systemd_unit.effective_exec_command as systemd really runs it: `$$` and `$VARIABLES`
    expanded by replace_env_argv (env-util.c), except under `:`. Variables take their values from
    `env` (the host's EnvironmentFile= contents, facts.env_files): without it, NeedsHostEnvironment.
    Refuses (UnitSyntaxError) no or several commands, a variable in the executable's word, and a
    variable whose value only systemd knows."""
    texts = [unit_text, *dropin_texts]
    commands = systemd_unit.exec_start_of(texts, specifiers)
    if len(commands) != 1:
        raise UnitSyntaxError(f"expected exactly one ExecStart= command, found {len(commands)}")
    command = commands[0]
    if ":" in command.flags:
        return command
    if not uses_variables(command.argv):
        return ExecCommand(path=command.path, argv=tuple(replace_env_argv(command.argv, lambda _: None)),
                           flags=command.flags)
    if env is None:
        raise systemd_unit.NeedsHostEnvironment("ExecStart= uses $VARIABLES; its argv needs the host's environment files")
    if referenced(command.argv[:1]):
        raise UnitSyntaxError(f"ExecStart= uses a variable in its first word ({command.argv[0]}); fleetspec "
                              f"moves the arguments only")
    expanded = expand(command.argv, exec_env_settings(texts, specifiers), env, specifiers)
    return ExecCommand(path=command.path, argv=expanded.argv, flags=command.flags, variables=expanded.used)

"""What an ExecStart launches, and which of its words sglang's parser reads (pure).

fleetspec rewrites an operator's command line only when it knows exactly who reads each word.
Two launch forms are supported: `<python> [python options] -m sglang.launch_server ARGS` and
`<bin>/sglang serve [MODEL] ARGS` (optionally behind `env NAME=VALUE …`). Everything else — shell
`-c` wrappers, container runtimes, other modules, wrapper scripts, `--config FILE` — is refused
with the form named, because the speculative flags would sit where fleetspec cannot move them
(inside a shell string, in a container fleetspec's overlay never reaches, in a YAML file).

ARGS are split the way the host version's argparse parser splits them, from a table of that
parser's actions (option string -> dest, nargs) generated from the real parser
(fleetspec.lab.optiontable writes fleetspec/model/sglang_options/<version>.json; tests prove the
tables equal the real parsers). The speculative group is every option whose `dest` starts with
`speculative_`, whatever spelling the operator used: a unique prefix (`--speculative-algo`,
argparse's allow_abbrev), an alias (`--speculative-draft`), `--opt=value`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Sequence

from packaging.version import InvalidVersion, Version

from fleetspec.errors import UserError
from fleetspec.model.option_table import DUMP_SCRIPT, TABLES, OptionTable, known_versions, load_table, parse_dump

__all__ = ["ALGO_DEST", "DUMP_SCRIPT", "LAUNCH_SERVER", "SERVE", "SPEC_DEST_PREFIX", "TABLES", "Derived", "Item",
           "LaunchForm", "LaunchRefused", "OptionTable", "classify", "derive", "known_versions",
           "load_table", "parse_dump", "parsed_args", "serve_positional", "sglang_version", "speculative_env",
           "split_items"]

SPEC_DEST_PREFIX = "speculative_"
ALGO_DEST = "speculative_algorithm"
LAUNCH_SERVER = "launch_server"
SERVE = "serve"

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "fish", "csh", "tcsh", "busybox"}
_CONTAINERS = {"docker", "podman", "nerdctl", "kubectl", "docker-compose", "podman-compose", "ctr",
               "crictl", "apptainer", "singularity", "enroot", "systemd-nspawn", "lxc-execute", "runc"}
_WRAPPERS = {"numactl", "taskset", "nice", "ionice", "chrt", "stdbuf", "timeout", "nohup", "setsid",
             "sudo", "su", "runuser", "srun", "mpirun", "torchrun", "uv", "conda", "micromamba",
             "mamba", "pipenv", "poetry", "pixi", "xargs", "sglang-router", "tini", "dumb-init"}
# python options without an argument, and those that take one (python's own getopt string).
_PY_FLAGS = set("bBdEhiIOPqsSuvVxR")
_PY_WITH_ARG = set("WX")


class LaunchRefused(UserError):
    """An ExecStart fleetspec will not rewrite; names the form and what the operator can do."""

    def __init__(self, form: str, why: str, advice: str):
        self.form, self.why, self.advice = form, why, advice
        super().__init__(f"ExecStart is {form}: {why}; {advice}")


PLAIN = ("put the plain command in ExecStart (`<venv>/bin/python -m sglang.launch_server …` or "
         "`<venv>/bin/sglang serve …`, environment in Environment= lines)")


# Items: ARGS split the way argparse splits them ----------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One option with its values (or a positional word), as argparse consumes it."""

    tokens: tuple[str, ...]
    dest: str | None            # None: a serve-level word sglang's parser never sees
    option: str | None = None   # the option string argparse resolved the first token to
    explicit: str | None = None  # the `=value` part, when written so

    @property
    def value(self) -> str | None:
        if self.explicit is not None:
            return self.explicit
        return self.tokens[1] if len(self.tokens) > 1 else None

    @property
    def speculative(self) -> bool:
        return bool(self.dest and self.dest.startswith(SPEC_DEST_PREFIX))


def split_items(args: Sequence[str], table: OptionTable, *, form: str = LAUNCH_SERVER,
                positional_model: bool = False) -> list[Item]:
    """ARGS as argparse consumes them; refuses what sglang's parser itself would refuse (so a
    command that never started is never rewritten) and what fleetspec cannot place exactly."""
    args = list(args)
    items: list[Item] = []
    i = 0
    if form == SERVE and positional_model and args and not args[0].startswith("-"):
        items.append(Item((args[0],), "model_path", None))
        i = 1
    while i < len(args):
        token = args[i]
        if form == SERVE and (token == "--model-type" or token.startswith("--model-type=")):
            value = token.split("=", 1)[1] if "=" in token else (args[i + 1] if i + 1 < len(args) else None)
            if value not in ("auto", "llm"):
                raise LaunchRefused("`sglang serve --model-type " + str(value) + "`",
                                    "only the LLM server runs speculative decoding",
                                    "leave this service out of the deploy: it serves no LLM to speculate for")
            n = 1 if "=" in token else 2
            items.append(Item(tuple(args[i:i + n]), None, "--model-type"))
            i += n
            continue
        if token == "--":
            raise LaunchRefused("a command with a bare `--`", "argparse takes every word after it as a "
                                "positional argument, which sglang refuses", PLAIN)
        item = _option_item(args, i, table)
        items.append(item)
        i += len(item.tokens)
    _check_items(items, table)
    return items


def _option_item(args: list[str], i: int, table: OptionTable) -> Item:
    """The option at args[i] with the values argparse gives it; refuses what argparse refuses."""
    token = args[i]
    found = table.resolve(token)
    if found is None:
        raise LaunchRefused(f"a command with the stray word {token!r}",
                            f"sglang {table.version}'s parser takes no positional arguments "
                            f"(it would exit with 'unrecognized arguments')", "fix the ExecStart first")
    option, explicit, verdict = found
    if verdict == "ambiguous":
        raise LaunchRefused(f"a command with the ambiguous option {token!r}",
                            f"sglang {table.version}'s parser refuses it (several options start so)",
                            "spell the option out in full")
    if verdict == "unknown":
        raise LaunchRefused(f"a command with the option {token.split('=', 1)[0]!r}",
                            f"sglang {table.version}'s parser does not know it (the service could "
                            f"not start with it on this version)", "fix the ExecStart first")
    assert option is not None  # the verdict is "ok"
    dest, nargs = table.options[option]
    j = i + 1
    if explicit is not None:
        if nargs == "0" and token.startswith("--"):
            raise LaunchRefused(f"a command with {token!r}", f"{option} takes no value and sglang "
                                f"{table.version}'s parser refuses `=…`", "remove the value")
    else:
        following = 0
        while i + 1 + following < len(args) and table.resolve(args[i + 1 + following]) is None \
                and args[i + 1 + following] != "--":
            following += 1
        want = {"0": 0, "1": 1, "?": min(following, 1), "*": following, "+": following}.get(nargs)
        if want is None:
            want = int(nargs)
        if want > following or (nargs == "+" and following == 0):
            raise LaunchRefused(f"a command where {token!r} lacks its value",
                                f"sglang {table.version}'s parser refuses it", "fix the ExecStart first")
        j = i + 1 + want
    return Item(tuple(args[i:j]), dest, option, explicit)


def _check_items(items: list[Item], table: OptionTable) -> None:
    """What fleetspec cannot place (`--config`) and what argparse requires (`--model-path`)."""
    for item in items:
        if item.dest == "config":
            raise LaunchRefused("`--config FILE`", "sglang merges the file's settings (its speculative ones "
                                "included) into the command line, where fleetspec cannot see or replace them",
                                "move the file's settings onto the command line; a playbook may support "
                                "config files later")
    for dest in table.required:
        if not any(item.dest == dest for item in items):
            raise LaunchRefused(f"a command without the {dest} option", f"sglang {table.version}'s parser "
                                f"requires it (the service could not start without it)", "fix the ExecStart first")


# Launch forms ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchForm:
    """A supported ExecStart: `head` words are kept byte for byte, `args` go to sglang's parser."""

    form: str                       # launch_server | serve
    prefix: str                     # ExecStart's prefix characters (-, @, :, +, !, !!), kept
    path: str                       # the executable systemd runs
    argv: tuple[str, ...]           # the whole argv (argv[0] may differ from path with '@')
    start: int                      # argv[start:] is what the entry point receives
    env_assignments: tuple[str, ...] = ()   # NAME=VALUE words of an `env` wrapper

    @property
    def head(self) -> list[str]:
        return list(self.argv[:self.start])

    @property
    def args(self) -> list[str]:
        return list(self.argv[self.start:])

    @property
    def label(self) -> str:
        return "python -m sglang.launch_server" if self.form == LAUNCH_SERVER else "sglang serve"


def serve_positional(version: str) -> bool:
    """`sglang serve MODEL` (a positional model path) is understood from 0.5.23 on; 0.5.13.post1's
    serve passes the word to the parser, which refuses it. A pre-release (0.5.23rc1) is before
    0.5.23, as PEP 440 orders them."""
    v = sglang_version(version)
    return v is not None and v >= Version("0.5.23")


def sglang_version(text: str | None) -> Version | None:
    """A version string as PEP 440 reads it (packaging, what pip compares with); None when it is
    no version (then neither newer nor older than any)."""
    try:
        return Version(text or "")
    except InvalidVersion:
        return None


def classify(argv: Sequence[str], *, path: str | None = None, prefix: str = "") -> LaunchForm:
    """The launch form of one ExecStart command, or LaunchRefused naming what it is instead."""
    argv = list(argv)
    if not argv:
        raise LaunchRefused("an empty command", "nothing to launch", PLAIN)
    path = path or argv[0]
    # With '@' argv[0] is only a name: what runs is `path`.
    i, exe, envs = 0, PurePosixPath(path).name, []
    if exe == "env":
        i = 1
        while i < len(argv) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[i]):
            envs.append(argv[i])
            i += 1
        if i >= len(argv) or argv[i].startswith("-"):
            raise LaunchRefused("an `env` wrapper with options", "fleetspec reads `env NAME=VALUE … program` only",
                                PLAIN)
        exe = PurePosixPath(argv[i]).name
    rest = argv[i + 1:]
    if _PYTHON.match(exe):
        return _classify_python(argv, i, rest, path, prefix, tuple(envs))
    if exe == "sglang":
        if not rest or rest[0] != "serve":
            sub = rest[0] if rest else "(nothing)"
            raise LaunchRefused(f"`sglang {sub}`", "only `sglang serve` launches the server", PLAIN)
        return LaunchForm(SERVE, prefix, path, tuple(argv), i + 2, tuple(envs))
    if exe in _SHELLS:
        raise LaunchRefused(f"a shell wrapper ({exe} {' '.join(rest[:1])} …)",
                            "the sglang command sits inside one shell word, where fleetspec cannot replace its "
                            "speculative flags (appended flags would become the shell's $0 $1 …)", PLAIN)
    if exe in _CONTAINERS or exe.startswith("docker"):
        raise LaunchRefused(f"a container runtime ({exe})", "fleetspec's overlay, PYTHONPATH and smoke tests work on "
                            "the host's python, never inside a container", "run sglang from a venv on the host "
                            "under systemd, or roll the change into the container image instead")
    if exe in _WRAPPERS:
        raise LaunchRefused(f"a wrapper program ({exe})", "fleetspec does not know how it passes its arguments on",
                            PLAIN + "; pin CPUs/NUMA with CPUAffinity=/NUMAPolicy= in the unit instead")
    raise LaunchRefused(f"an unknown executable ({path})", "fleetspec cannot tell which of its words sglang reads "
                        "(a wrapper script may add or rewrite flags)", PLAIN)


def _classify_python(argv: list[str], i: int, rest: list[str], path: str, prefix: str,
                     envs: tuple[str, ...]) -> LaunchForm:
    """Walk python's own options (clusters such as `-um` too) to `-m MODULE`."""
    k = 0
    while k < len(rest):
        word = rest[k]
        if word == "-" or not word.startswith("-"):
            raise LaunchRefused(f"a python script ({word})", "fleetspec cannot tell how the script passes its "
                                "arguments to sglang", PLAIN)
        if word.startswith("--"):     # --, --check-hash-based-pycs …: not in a service's ExecStart
            raise LaunchRefused(f"python {word}", "fleetspec reads python's short options only", PLAIN)
        letters = word[1:]
        for n, letter in enumerate(letters):
            tail = letters[n + 1:]
            if letter == "m":
                module = tail or (rest[k + 1] if k + 1 < len(rest) else "")
                start = i + 1 + k + (1 if tail else 2)
                if module != "sglang.launch_server":
                    raise LaunchRefused(f"python -m {module}", "fleetspec moves sglang.launch_server and "
                                        "`sglang serve` only (another module may parse its flags differently)", PLAIN)
                return LaunchForm(LAUNCH_SERVER, prefix, path, tuple(argv), start, envs)
            if letter == "c":
                raise LaunchRefused("python -c", "the sglang call sits inside a python string", PLAIN)
            if letter in "EI":
                raise LaunchRefused(f"python -{letter}", "it makes python ignore PYTHONPATH, so the release's "
                                    "overlay would never load", "drop -E/-I from the ExecStart")
            if letter in _PY_WITH_ARG:
                if not tail:
                    k += 1           # its argument is the next word
                break
            if letter not in _PY_FLAGS:
                raise LaunchRefused(f"python -{letter}", "an option fleetspec does not know", PLAIN)
        k += 1
    raise LaunchRefused("python without -m", "no `-m sglang.launch_server` in the command", PLAIN)


def parsed_args(form: LaunchForm, argv: Sequence[str], version: str) -> list[str]:
    """Exactly the list sglang's entry point hands to prepare_server_args for this argv:
    launch_server takes sys.argv[1:]; `sglang serve` drops `--model-type X` and (0.5.23 on) turns a
    leading positional model into `--model-path MODEL`."""
    args = list(argv[form.start:])
    if form.form == LAUNCH_SERVER:
        return args
    out, i = [], 0
    while i < len(args):
        if args[i] == "--model-type":
            i += 2
            continue
        if args[i].startswith("--model-type="):
            i += 1
            continue
        out.append(args[i])
        i += 1
    if serve_positional(version) and out and not out[0].startswith("-"):
        out = ["--model-path", out[0], *out[1:]]
    return out


# Deriving the new command ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Derived:
    argv: list[str]
    kept: list[list[str]]         # non-speculative items, unchanged
    dropped: list[list[str]]      # the baseline's speculative items, removed
    carried: list[list[str]]      # speculative items the playbook keeps (draft runtime backends)
    added: list[str]              # the playbook's flags
    algorithm: str | None         # the baseline's algorithm, as written
    notes: list[str] = field(default_factory=list)
    changed: list[list[list[str]]] = field(default_factory=list)   # [before, after] (graphsize)


def derive(form: LaunchForm, table: OptionTable, flags: Sequence[str], *, carry: Sequence[str] = (),
           drop: Sequence[str] = (), version: str | None = None) -> Derived:
    """The baseline with its speculative group (every item whose dest starts with speculative_,
    plus the dests in `drop`) replaced by `flags`, at the place the group started (or at the end).
    Items whose dest is in `carry` stay where they are unless `flags` set the same dest."""
    version = version or table.version
    items = split_items(form.args, table, form=form.form, positional_model=serve_positional(version))
    flag_dests = set()
    for token in flags:
        found = table.resolve(token)
        if found and found[0] is not None and found[2] == "ok":
            flag_dests.add(table.options[found[0]][0])
    carry_dests = {_dest_of(table, c) for c in carry} - {None}
    drop_dests = {_dest_of(table, d) for d in drop} - {None}
    out: list[str] = list(form.head)
    kept, dropped, carried = [], [], []
    at = None
    algorithm = None
    for item in items:
        if item.dest == ALGO_DEST:
            algorithm = item.value
        is_spec = item.speculative or item.dest in drop_dests
        if is_spec and item.dest in carry_dests and item.dest not in flag_dests:
            carried.append(list(item.tokens))
            out.extend(item.tokens)
            continue
        if is_spec:
            if at is None:
                at = len(out)
            dropped.append(list(item.tokens))
            continue
        kept.append(list(item.tokens))
        out.extend(item.tokens)
    at = len(out) if at is None else at
    new = [*out[:at], *flags, *out[at:]]
    return Derived(argv=new, kept=kept, dropped=dropped, carried=carried, added=list(flags), algorithm=algorithm)


def _dest_of(table: OptionTable, name: str) -> str | None:
    if not name.startswith("-"):
        return name
    found = table.resolve(name)
    return table.options[found[0]][0] if found and found[0] is not None and found[2] == "ok" else None


# Speculation-only environment -------------------------------------------------------------------------
SPEC_ENV = re.compile(r"^SGLANG_(ENABLE_SPEC_V2|ENABLE_\w*SPEC\w*|SIMULATE_ACC_\w+|\w*SPEC(ULATIVE)?_\w+|"
                      r"\w*EAGLE\w*|\w*DFLASH\w*|\w*NEXTN\w*|\w*DDTREE\w*|\w*MTP\w*)$")
SIMULATED = re.compile(r"^SGLANG_SIMULATE_ACC_\w+$")


def speculative_env(names: Sequence[str]) -> list[str]:
    """The environment names that only matter to speculative decoding (listed in the plan; the
    playbook's `launch.env_keep` says which survive; SGLANG_SIMULATE_ACC_* fakes acceptance)."""
    return [n for n in names if SPEC_ENV.match(n)]

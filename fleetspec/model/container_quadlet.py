"""Podman Quadlet `.container` files (pure): the engine command they run, and the same file with
only that command changed.

Quadlet (podman's systemd generator) turns `[Container]` into `podman run … IMAGE <Exec words>`:
`Image=` is the image, the last `Exec=` the command (split exec-like: quotes removed, C escapes
applied), `PodmanArgs=` extra run options (every line, split the same way), `Entrypoint=` the
entrypoint; `Volume=`, `Environment=`, `Network=`, `AddDevice=`, `PublishPort=`, `ContainerName=` …
become run options. The generated ExecStart keeps `%` specifiers and `$VARIABLES` for systemd,
so an Exec word with a specifier other than `%%` or with a variable is refused here.

Deriving changes one thing: the last `Exec=` line (with its continuation lines) is replaced by
`Exec=<new command>`, quoted as an ExecStart= word is (render.systemd_quote); every other byte
of the file stays. This reads published `.container` files (the corpus); a deploy onto a Quadlet
host works from the unit Quadlet generated instead (ops.container_plan: a drop-in on it, the
`.container` file never written).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from fleetspec.model import launch
from fleetspec.model.container_launch import RuntimeOption, classify_inside, split_options
from fleetspec.model.container_options import RuntimeOptions, load
from fleetspec.model.launch import LaunchForm, LaunchRefused

ADVICE = "put the engine command in Exec= (`Exec=python3 -m sglang.launch_server …` or `Exec=sglang serve …`)"
WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class Entry:
    """One `Key=value` of the file: its section, and the lines [first, last] it was written on."""

    section: str
    key: str
    value: str
    first: int
    last: int


def entries(text: str) -> tuple[list[str], list[Entry]]:
    """The file's lines (ends kept) and its assignments, continuation lines joined as systemd does."""
    parts = re.split(r"(\r\n|\r|\n)", text)
    lines = [parts[i] + (parts[i + 1] if i + 1 < len(parts) else "") for i in range(0, len(parts), 2)]
    if lines and lines[-1] == "":
        lines.pop()
    out: list[Entry] = []
    section, i = "", 0
    while i < len(lines):
        first = i
        line = lines[i].strip(WHITESPACE)
        i += 1
        if not line or line[0] in "#;":
            continue
        while (len(line) - len(line.rstrip("\\"))) % 2 == 1 and i < len(lines):
            nxt = lines[i].strip(WHITESPACE)
            i += 1
            if nxt and nxt[0] in "#;":
                line = line[:-1] + " "
                continue
            line = line[:-1] + " " + nxt
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, eq, value = line.partition("=")
        if not eq or not section:
            raise LaunchRefused("a Quadlet file with a line that is not an assignment", f"{line[:60]!r}",
                                "fix the file first")
        out.append(Entry(section, key.strip(WHITESPACE), value.strip(WHITESPACE), first, i - 1))
    return lines, out


def exec_words(value: str, key: str = "Exec") -> list[str]:
    """An Exec=/PodmanArgs= value as the words the process gets (no specifiers but `%%`, no variables)."""
    from fleetspec import systemd_unit
    from fleetspec.remote.facts import execenv

    words: list[str] = []
    i = 0
    while True:
        try:
            word, i = systemd_unit.extract_word(value, i)
            if word is None:
                break
            words.append(systemd_unit.resolve_specifiers(word))
        except systemd_unit.UnitSyntaxError as err:
            raise LaunchRefused(f"a Quadlet {key}= that fleetspec cannot read exactly", str(err), ADVICE) from None
    if execenv.uses_variables(words):
        raise LaunchRefused(f"a Quadlet {key}= with $VARIABLES", "systemd expands them in the generated unit, from "
                            "an environment fleetspec does not read here", ADVICE)
    return execenv.replace_env_argv(words, lambda _: None)


@dataclass(frozen=True)
class QuadletContainer:
    text: str
    image: str
    entries: tuple[Entry, ...]
    podman_args: tuple[RuntimeOption, ...]
    entrypoint: tuple[str, ...] | None
    exec_entry: Entry
    engine: LaunchForm

    def values(self, key: str) -> list[str]:
        return [e.value for e in self.entries if e.section == "Container" and e.key == key]

    @property
    def label(self) -> str:
        return f"Quadlet podman run {self.image} ({self.engine.label})"


def parse_quadlet(text: str, options: RuntimeOptions | None = None) -> QuadletContainer:
    """The `[Container]` of a .container file, or LaunchRefused naming what cannot be moved exactly."""
    _, found = entries(text)
    container = [e for e in found if e.section == "Container"]
    images = [e.value for e in container if e.key == "Image"]
    if not images or not images[-1]:
        raise LaunchRefused("a Quadlet file without Image=", "fleetspec moves the command of an image's "
                            "container only", "set Image=")
    table = options or load("podman")
    words = [w for e in container if e.key == "PodmanArgs" for w in exec_words(e.value, "PodmanArgs")]
    args, end = split_options(words, 0, {**table.main, **table.run}, "a Quadlet PodmanArgs=")
    if end != len(words):
        raise LaunchRefused("a Quadlet PodmanArgs= with the word " + repr(words[end]), "it is not a podman run "
                            "option, so the image and command would move", "put options only in PodmanArgs=")
    entrypoint = _entrypoint(container, args)
    execs = [e for e in container if e.key == "Exec"]
    inside = [*(entrypoint or ()), *(exec_words(execs[-1].value) if execs else ())]
    if not execs or not inside or (entrypoint is None and inside[0].startswith("-")):
        raise LaunchRefused(f"a Quadlet file for {images[-1]} with no engine command in Exec=", "the image's "
                            "entrypoint hides the engine command, so fleetspec cannot see or replace its flags", ADVICE)
    engine = classify_inside(inside, "Quadlet")
    return QuadletContainer(text, images[-1], tuple(found), tuple(args),
                            None if entrypoint is None else tuple(entrypoint), execs[-1], engine)


def _entrypoint(container: Sequence[Entry], args: Sequence[RuntimeOption]) -> list[str] | None:
    values = [e.value for e in container if e.key == "Entrypoint"]
    values += [o.value or "" for o in args if o.name == "--entrypoint"]
    if not values:
        return None
    return [values[-1]] if values[-1] else []


def derive_quadlet(q: QuadletContainer, table: launch.OptionTable, flags: Sequence[str], *,
                   carry: Sequence[str] = (), drop: Sequence[str] = (), version: str | None = None) -> str:
    """The file with its last Exec= replaced by the derived command; every other byte kept."""
    from fleetspec import render

    derived = launch.derive(q.engine, table, flags, carry=carry, drop=drop, version=version)
    skip = len(q.entrypoint or ())
    keep = max(skip, q.engine.start)
    if derived.argv[:keep] != list(q.engine.argv[:keep]):
        raise LaunchRefused("a Quadlet Entrypoint=", "the derived command would change the entrypoint's words", ADVICE)
    new_words = derived.argv[skip:]
    lines, _ = entries(q.text)
    first, last = q.exec_entry.first, q.exec_entry.last
    ending = lines[last][len(lines[last].rstrip("\r\n")):]
    lines[first:last + 1] = ["Exec=" + " ".join(render.systemd_quote(w) for w in new_words) + ending]
    text = "".join(lines)
    again = parse_quadlet(text)
    if list(again.engine.argv[skip:]) != new_words:
        raise LaunchRefused("a Quadlet file fleetspec cannot rewrite exactly", "the new Exec= does not read back "
                            "as the derived command", ADVICE)
    return text

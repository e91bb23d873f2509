"""Compose services (pure): the engine command a compose file's service runs, and the same file
with only that command changed; and the `docker compose … up` ExecStart that names the file.

A service runs `entrypoint` + `command` (each a list, or a string split as a shell splits words;
with no `entrypoint` the image's own runs in front of `command`). Compose interpolates `$VAR` /
`${VAR}` in every value from the environment and `.env`, which fleetspec does not read, so such a
value is refused; `$$` is a literal `$`. A string with shell operators (`;`, `|`, `&&`, …) is
refused: compose would hand them to the program as words, never to a shell.

Deriving replaces exactly the `command:` value's text (its YAML node's span) with a flow list of
the new words, JSON-quoted and `$` written `$$`; every other byte stays. The result is parsed
back and must give the derived command, with every other key of the file unchanged.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Sequence

import yaml

from fleetspec.model import container_launch, launch
from fleetspec.model.container_launch import ContainerRun, classify_inside
from fleetspec.model.launch import LaunchForm, LaunchRefused
from fleetspec.model.yamlload import compose
from fleetspec.model.yamlload import load as load_yaml

ADVICE = ("give the service the engine command (`entrypoint: [python3, -m, sglang.launch_server]` and the flags "
          "in `command:`, or the whole command in `command:`)")
KEPT = ("image", "entrypoint", "command", "environment", "volumes", "ipc", "network_mode", "healthcheck")


@dataclass(frozen=True)
class ComposeService:
    name: str
    image: str
    entrypoint: tuple[str, ...] | None
    command: tuple[str, ...] | None
    settings: dict[str, Any]              # the KEPT keys as the file has them (for the plan)
    command_span: tuple[int, int] | None  # the command value's text in the file
    engine: LaunchForm

    @property
    def label(self) -> str:
        return f"compose service {self.name} ({self.image}, {self.engine.label})"


def words_of(value: Any, where: str) -> list[str]:
    """A compose entrypoint/command value as words, interpolation refused and `$$` unescaped."""
    if isinstance(value, str):
        lexer = shlex.shlex(value, posix=True, punctuation_chars=";&|<>()")
        lexer.whitespace_split = True
        words = list(lexer)
        if any(w and all(c in ";&|<>()" for c in w) for w in words):
            raise LaunchRefused(f"{where} with shell operators", "compose passes them to the program as words, "
                                "never to a shell", ADVICE)
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise LaunchRefused(f"{where} that is neither a string nor a list of strings", "fleetspec reads the "
                            "compose forms only", ADVICE)
    out = []
    for word in words:
        if "$" in word.replace("$$", ""):
            raise LaunchRefused(f"{where} with compose interpolation ({word})", "compose fills it from an "
                                "environment or .env file fleetspec does not read", "write the value out")
        out.append(word.replace("$$", "$"))
    return out


def _service_nodes(text: str) -> dict[str, yaml.MappingNode]:
    root = compose(text)
    services = _child(root, "services") if isinstance(root, yaml.MappingNode) else None
    if not isinstance(services, yaml.MappingNode):
        raise LaunchRefused("a compose file without services", "nothing to run", ADVICE)
    return {k.value: v for k, v in services.value if isinstance(v, yaml.MappingNode)}


def _child(node: yaml.Node, key: str) -> yaml.Node | None:
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            found: yaml.Node = v
            return found
    return None


def parse_compose(text: str, service: str | None = None) -> ComposeService:
    """The service that runs sglang (or `service`), or LaunchRefused naming what cannot be moved."""
    try:
        data = load_yaml(text)
        nodes = _service_nodes(text)
    except yaml.YAMLError as err:
        raise LaunchRefused("a compose file that is not valid YAML", str(err).splitlines()[0], "fix it first") from None
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict) or not services:
        raise LaunchRefused("a compose file without services", "nothing to run", ADVICE)
    if service is not None:
        if service not in services:
            raise LaunchRefused(f"a compose file without the service {service}", "it is not in `services:`", ADVICE)
        return _service(service, services[service], nodes[service])
    found, errors = [], []
    for name, spec in services.items():
        try:
            found.append(_service(name, spec, nodes[name]))
        except LaunchRefused as err:
            errors.append((_mentions_sglang(spec), err))
    if len(found) == 1:
        return found[0]
    if not found:
        # The sglang service's own problem, not a downloader's or a router's listed before it.
        raise next((err for sglang, err in errors if sglang), errors[0][1])
    raise LaunchRefused("a compose file with several sglang services", ", ".join(s.name for s in found),
                        "name the service")


def _mentions_sglang(spec: Any) -> bool:
    """Whether a service looks like the engine's: sglang in its image, entrypoint or command."""
    if not isinstance(spec, dict):
        return False
    return any("sglang" in str(spec.get(key) or "").lower() for key in ("image", "entrypoint", "command"))


def _service(name: str, spec: Any, node: yaml.MappingNode) -> ComposeService:
    where = f"compose service {name}"
    if not isinstance(spec, dict) or not isinstance(spec.get("image"), str):
        raise LaunchRefused(f"{where} without an image", "fleetspec moves the command of an image's container "
                            "only (a `build:` service has none to keep)", "set `image:`")
    entry = words_of(spec["entrypoint"], f"{where}'s entrypoint") if spec.get("entrypoint") is not None else None
    command = words_of(spec["command"], f"{where}'s command") if spec.get("command") is not None else None
    inside = [*(entry or ()), *(command or ())]
    if not inside or (entry is None and inside[0].startswith("-")):
        raise LaunchRefused(f"{where} ({spec['image']}) with no engine command", "the image's entrypoint hides "
                            "the engine command, so fleetspec cannot see or replace its flags", ADVICE)
    engine = classify_inside(inside, "compose")
    span_node = _child(node, "command")
    span = None if span_node is None else (span_node.start_mark.index, span_node.end_mark.index)
    return ComposeService(name, spec["image"], None if entry is None else tuple(entry),
                          None if command is None else tuple(command),
                          {k: spec[k] for k in KEPT if k in spec}, span, engine)


def derive_compose(text: str, svc: ComposeService, table: launch.OptionTable, flags: Sequence[str], *,
                   carry: Sequence[str] = (), drop: Sequence[str] = (), version: str | None = None) -> str:
    """The file with the service's `command:` value replaced by the derived command; every other byte kept."""
    derived = launch.derive(svc.engine, table, flags, carry=carry, drop=drop, version=version)
    skip = len(svc.entrypoint or ())
    keep = max(skip, svc.engine.start)
    if derived.argv[:keep] != list(svc.engine.argv[:keep]) or svc.command_span is None:
        raise LaunchRefused(f"compose service {svc.name} whose entrypoint holds the flags", "fleetspec rewrites "
                            "`command:` only", ADVICE)
    new_command = derived.argv[skip:]
    start, end = svc.command_span
    flow = "[" + ", ".join(json.dumps(w.replace("$", "$$")) for w in new_command) + "]"
    old = text[start:end]
    # A block list's span runs on to the next key's indentation: that line break and indentation stay.
    out = text[:start] + flow + old[len(old.rstrip()):] + text[end:]
    try:
        before, after = load_yaml(text), load_yaml(out)
        again = parse_compose(out, svc.name)
    except yaml.YAMLError:
        raise LaunchRefused("a compose file fleetspec cannot rewrite exactly", "the rewritten file does not "
                            "parse back", ADVICE) from None
    before["services"][svc.name].pop("command")
    after["services"][svc.name].pop("command")
    if list(again.command or ()) != new_command or before != after:
        raise LaunchRefused("a compose file fleetspec cannot rewrite exactly", "the new command does not read "
                            "back as the derived one", ADVICE)
    return out


@dataclass(frozen=True)
class ComposeUp:
    """`docker compose [-f FILE …] up [SERVICE …]` in an ExecStart: which files it reads."""

    files: tuple[str, ...]
    project_directory: str | None
    services: tuple[str, ...]


_COMPOSE_MAIN = {"-f": True, "--file": True, "-p": True, "--project-name": True, "--project-directory": True,
                 "--env-file": True, "--profile": True, "--ansi": True, "--progress": True, "--parallel": True,
                 "--compatibility": False, "--dry-run": False, "--all-resources": False}
_COMPOSE_UP = {"-d": False, "--detach": False, "--build": False, "--no-build": False, "--force-recreate": False,
               "--no-recreate": False, "--remove-orphans": False, "--abort-on-container-exit": False,
               "--exit-code-from": True, "--no-deps": False, "--pull": True, "--wait": False, "--wait-timeout": True,
               "--no-color": False, "--quiet-pull": False, "--attach": True, "--no-attach": True, "--scale": True,
               "-t": True, "--timeout": True, "--no-start": False, "--always-recreate-deps": False,
               "-V": False, "--renew-anon-volumes": False, "--no-log-prefix": False, "--timestamps": False}


def parse_compose_up(argv: Sequence[str]) -> ComposeUp:
    """`docker compose …` / `docker-compose …` / `podman-compose …` running `up`."""
    from fleetspec.model.container_launch import split_options

    argv = list(argv)
    i = 2 if len(argv) > 1 and argv[1] == "compose" else 1
    main, i = split_options(argv, i, _COMPOSE_MAIN, "`compose`")
    if argv[i:i + 1] != ["up"]:
        raise LaunchRefused(f"`compose {' '.join(argv[i:i + 1]) or '(nothing)'}`", "only `up` runs the services",
                            ADVICE)
    _, j = split_options(argv, i + 1, _COMPOSE_UP, "`compose up`")
    files = tuple(o.value or "" for o in main if o.name in ("-f", "--file"))
    project = [o.value for o in main if o.name == "--project-directory"]
    return ComposeUp(files, project[-1] if project else None, tuple(argv[j:]))


COMPOSE = ("docker-compose", "podman-compose")


def classify_exec(argv: Sequence[str], *, path: str | None = None,
                  prefix: str = "") -> LaunchForm | ContainerRun | ComposeUp:
    """Any ExecStart command fleetspec reads: a bare-metal launch form, a container run, or a
    `compose … up` (whose compose file this module reads)."""
    path = path or argv[0]
    name = PurePosixPath(path).name
    if name in COMPOSE or (container_launch.runtime_of(path) is not None and argv[1:2] == ["compose"]):
        return parse_compose_up(argv)
    if container_launch.runtime_of(path) is not None:
        return container_launch.parse_run(argv, path=path, prefix=prefix)
    return launch.classify(argv, path=path, prefix=prefix)

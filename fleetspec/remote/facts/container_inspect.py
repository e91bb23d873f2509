"""A container's and its image's facts from `<runtime> inspect` JSON (docker and podman print the
same shape for what is read here): the runtime's version, the image's id, digest, ENTRYPOINT/CMD
and labels; the container's state, restart count, health, labels and command.

One command prints the runtime's version line, then `image inspect` of the image and `inspect
--type container` of the container, each as one `FLEETSPEC-INSPECT <kind> <rc>` header followed by
its JSON, so a missing container (not created yet, or removed by `--rm`) is a fact, not a failure.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

MARK = "FLEETSPEC-INSPECT"


@dataclass(frozen=True)
class ImageInfo:
    id: str
    digest: str | None                       # podman's Digest; docker has RepoDigests only
    repo_digests: tuple[str, ...]
    entrypoint: tuple[str, ...]              # () when the image has none
    cmd: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    image_id: str
    image_name: str | None
    status: str                              # created | running | exited | restarting | …
    running: bool
    restarting: bool
    exit_code: int
    restart_count: int
    health: str | None                       # the healthcheck's status, None without one
    labels: dict[str, str] = field(default_factory=dict)
    path: str = ""
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Inspected:
    version: str | None
    image: ImageInfo | None
    container: ContainerInfo | None


def command(runtime: str, image: str, container: str | None = None) -> str:
    rt = shlex.quote(runtime)
    parts = [f"{rt} --version 2>/dev/null | head -n1 | sed 's/^/{MARK} version /'",
             f"o=$({rt} image inspect -- {shlex.quote(image)} 2>/dev/null); echo \"{MARK} image $?\"; "
             f"printf '%s\\n' \"$o\""]
    if container:
        parts.append(f"o=$({rt} inspect --type container -- {shlex.quote(container)} 2>/dev/null); "
                     f"echo \"{MARK} container $?\"; printf '%s\\n' \"$o\"")
    return "; ".join(parts)


def parse(stdout: str, **_: Any) -> Inspected:
    version, blocks, kind, rc = None, {}, None, 1
    lines: list[str] = []
    for line in stdout.splitlines() + [f"{MARK} end 0"]:
        if not line.startswith(MARK + " "):
            lines.append(line)
            continue
        if kind is not None and rc == 0:
            blocks[kind] = "\n".join(lines)
        words = line.split(" ", 2)
        if words[1] == "version":
            version, kind = (words[2] if len(words) > 2 else None), None
        else:
            kind, rc = words[1], int(words[2]) if len(words) > 2 and words[2].isdigit() else 1
        lines = []
    image = parse_image(blocks["image"]) if "image" in blocks else None
    container = parse_container(blocks["container"]) if "container" in blocks else None
    return Inspected(version, image, container)


def _first(text: str) -> dict[str, Any]:
    data = json.loads(text)
    if isinstance(data, list):
        data = data[0] if data else {}
    if not isinstance(data, dict):
        raise ValueError("inspect output is not a JSON object")
    return data


def _words(value: Any) -> tuple[str, ...]:
    """ENTRYPOINT/CMD: a list, null, or (podman's container view) a string, "" for none."""
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    if isinstance(value, str) and value:
        return (value,)
    return ()


def parse_image(text: str) -> ImageInfo:
    data = _first(text)
    config = data.get("Config") or {}
    return ImageInfo(id=str(data.get("Id", "")), digest=data.get("Digest") or None,
                     repo_digests=tuple(data.get("RepoDigests") or ()),
                     entrypoint=_words(config.get("Entrypoint")), cmd=_words(config.get("Cmd")),
                     labels=dict(config.get("Labels") or data.get("Labels") or {}))


def parse_container(text: str) -> ContainerInfo:
    data = _first(text)
    state = data.get("State") or {}
    config = data.get("Config") or {}
    health = state.get("Health") or {}
    return ContainerInfo(
        id=str(data.get("Id", "")), name=str(data.get("Name", "")).lstrip("/"), image_id=str(data.get("Image", "")),
        image_name=data.get("ImageName") or config.get("Image") or None, status=str(state.get("Status", "")),
        running=bool(state.get("Running")), restarting=bool(state.get("Restarting")),
        exit_code=int(state.get("ExitCode") or 0), restart_count=int(data.get("RestartCount") or 0),
        health=health.get("Status") or None, labels=dict(config.get("Labels") or {}),
        path=str(data.get("Path", "")), args=tuple(str(a) for a in data.get("Args") or ()))

"""LeaderWorkerSet manifests (pure): the sglang container of each pod template, and the manifest
with only that container's command/args and env, and the release's volume, changed.

An LWS (`leaderworkerset.x-k8s.io/v1`) runs `spec.leaderWorkerTemplate.leaderTemplate` for each
group's leader (the worker template when absent) and `workerTemplate` for the rest; every pod of
a group runs the same sglang server arguments (`--node-rank` aside), so both templates get the
same derivation. A container runs `command` + `args` (without `command` the image's entrypoint,
which fleetspec cannot see: refused). `$(VAR)` words are Kubernetes' and kept as written.

The release reaches the pods without changing their image: an initContainer of a versioned
release image copies it into an emptyDir, mounted read-only in the sglang container, whose
PYTHONPATH puts the release's overlay first (DEVELOPING.md says why not a derived image).
Everything else in the file keeps its bytes (model/k8s_edit.py); the result is parsed back and
must equal the original data with exactly these changes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import yaml

from fleetspec.errors import UserError
from fleetspec.model.k8s_edit import Editor, EditRefused, compose_all, get

API = "leaderworkerset.x-k8s.io/"
ROLES = ("leaderTemplate", "workerTemplate")
VOLUME = "fleetspec-release"
MOUNT = "/opt/fleetspec/release"


@dataclass(frozen=True)
class Container:
    """One pod template's container as the manifest has it."""

    where: str                    # "<file>: LeaderWorkerSet NAME leaderTemplate container C" for messages
    doc: int
    role: str
    index: int                    # in the template's containers
    data: dict[str, Any]
    pod: dict[str, Any] = field(default_factory=dict)     # the template's spec (volumes, initContainers)

    @property
    def argv(self) -> list[str]:
        return [str(w) for w in (self.data.get("command") or []) + (self.data.get("args") or [])]

    @property
    def env(self) -> list[dict[str, Any]]:
        return list(self.data.get("env") or [])


@dataclass(frozen=True)
class Change:
    """What to do to one container (and its pod template, for the release)."""

    container: Container
    argv: list[str]
    env_set: dict[str, str] = field(default_factory=dict)
    env_unset: tuple[str, ...] = ()
    release_image: str | None = None


def _docs(text: str, path: str) -> list[Any]:
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None


def templates(text: str, path: str) -> list[tuple[str, int, str, dict[str, Any]]]:
    """(where, document index, role, pod template) of every LeaderWorkerSet in the file."""
    out = []
    for i, doc in enumerate(_docs(text, path)):
        if not isinstance(doc, dict) or doc.get("kind") != "LeaderWorkerSet" or not str(
                doc.get("apiVersion", "")).startswith(API):
            continue
        name = (doc.get("metadata") or {}).get("name", "?")
        lwt = ((doc.get("spec") or {}).get("leaderWorkerTemplate") or {})
        for role in ROLES:
            if isinstance(lwt.get(role), dict):
                out.append((f"{path}: LeaderWorkerSet {name} {role}", i, role, lwt[role]))
    if not out:
        raise UserError(f"{path}: no LeaderWorkerSet ({API}v1) with a leaderTemplate or workerTemplate in it")
    return out


def containers(text: str, path: str) -> list[list[Container]]:
    """Each pod template's containers, in the file's order."""
    out = []
    for where, doc, role, template in templates(text, path):
        pod = template.get("spec") or {}
        out.append([Container(f"{where} container {c.get('name', k)}", doc, role, k, c, pod)
                    for k, c in enumerate(pod.get("containers") or []) if isinstance(c, dict)])
    return out


def _template_node(docs: list[yaml.Node], c: Container) -> yaml.MappingNode:
    node = get(get(get(docs[c.doc], "spec"), "leaderWorkerTemplate"), c.role)
    assert isinstance(node, yaml.MappingNode)
    return node


def patch(text: str, path: str, changes: list[Change]) -> str:
    """The file with each change made in place; UserError (one line) where it cannot be exactly."""
    docs = compose_all(text)
    edit = Editor(text, path)
    for ch in changes:
        spec = get(_template_node(docs, ch.container), "spec")
        node = get(spec, "containers").value[ch.container.index]        # type: ignore[union-attr]
        _argv(edit, node, ch)
        _env(edit, node, ch)
        if ch.release_image:
            _release(edit, spec, node, ch)                               # type: ignore[arg-type]
    out = edit.result()
    _check(text, out, path, changes)
    return out


def _argv(edit: Editor, node: yaml.MappingNode, ch: Change) -> None:
    c = ch.container
    command = [str(w) for w in c.data.get("command") or []]
    args = [str(w) for w in c.data.get("args") or []]
    if ch.argv == c.argv:
        return
    if args and ch.argv[:len(command)] == command:
        edit.replace_sequence(get(node, "args"), args, ch.argv[len(command):])      # type: ignore[arg-type]
    elif not args:
        edit.replace_sequence(get(node, "command"), command, ch.argv)               # type: ignore[arg-type]
    else:
        raise UserError(f"{c.where}: its flags are split between command and args, and the derived launch changes "
                        f"those in command; put the flags in args")


def _env_items(ch: Change) -> list[dict[str, str]]:
    items = [{"name": k, "value": v} for k, v in ch.env_set.items()]
    if ch.release_image:
        items.append({"name": "PYTHONPATH", "value": f"{MOUNT}/overlay"})
    return items


def _env(edit: Editor, node: yaml.MappingNode, ch: Change) -> None:
    c = ch.container
    added = _env_items(ch)
    names = {i["name"] for i in added}
    clash = [e.get("name") for e in c.env if e.get("name") in names]
    if clash:
        raise UserError(f"{c.where}: env sets {clash[0]} itself, which the release sets; take it out of the manifest")
    drop = [k for k, e in enumerate(c.env) if e.get("name") in ch.env_unset]
    env = get(node, "env")
    if env is None:
        if added:
            edit.add_key(node, "env", added)
        return
    if not isinstance(env, yaml.SequenceNode) or env.flow_style or not env.value:
        kept = [e for k, e in enumerate(c.env) if k not in drop]
        if drop or added:
            edit.append_items(env, added, kept)
        return
    edit.remove_items(env, drop)
    if added:
        if len(drop) == len(c.env):
            raise UserError(f"{c.where}: every env item is one the release unsets; fleetspec cannot rewrite an env "
                            f"list it empties in place")
        edit.append_items(env, added)


def _release_items(image: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The sglang container's mount, the initContainer that fills the emptyDir, and the emptyDir."""
    return ({"name": VOLUME, "mountPath": MOUNT, "readOnly": True},
            {"name": VOLUME, "image": image, "command": ["cp", "-a", "/release/.", MOUNT + "/"],
             "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}]},
            {"name": VOLUME, "emptyDir": {}})


def _release(edit: Editor, spec: yaml.MappingNode, node: yaml.MappingNode, ch: Change) -> None:
    c = ch.container
    pod = c.pod
    if any(v.get("name") == VOLUME for v in pod.get("volumes") or []):
        raise UserError(f"{c.where}: the pod already has a volume named {VOLUME}")
    mount, init, volume = _release_items(str(ch.release_image))
    for parent, key, item, old in ((node, "volumeMounts", mount, c.data.get("volumeMounts") or []),
                                   (spec, "initContainers", init, pod.get("initContainers") or []),
                                   (spec, "volumes", volume, pod.get("volumes") or [])):
        target = get(parent, key)
        if target is None:
            edit.add_key(parent, key, [item])
        else:
            edit.append_items(target, [item], old)


def expected(docs: list[Any], changes: list[Change]) -> list[Any]:
    """The original data with the changes made: what the patched text must read as."""
    docs = copy.deepcopy(docs)
    for ch in changes:
        c = ch.container
        template = docs[c.doc]["spec"]["leaderWorkerTemplate"][c.role]
        spec = template["spec"]
        data = spec["containers"][c.index]
        command = data.get("command") or []
        if ch.argv != c.argv:
            if data.get("args"):
                data["args"] = ch.argv[len(command):]
            else:
                data["command"] = ch.argv
        env = [e for e in data.get("env") or [] if e.get("name") not in ch.env_unset] + _env_items(ch)
        if env or "env" in data:
            data["env"] = env
        if ch.release_image:
            mount, init, volume = _release_items(ch.release_image)
            data["volumeMounts"] = (data.get("volumeMounts") or []) + [mount]
            spec["initContainers"] = (spec.get("initContainers") or []) + [init]
            spec["volumes"] = (spec.get("volumes") or []) + [volume]
    return docs


def _check(before: str, after: str, path: str, changes: list[Change]) -> None:
    try:
        got = list(yaml.safe_load_all(after))
    except yaml.YAMLError:
        raise EditRefused(f"{path}: the patched manifest does not parse back; its layout is not one fleetspec "
                          f"can edit in place") from None
    if got != expected(list(yaml.safe_load_all(before)), changes):
        raise EditRefused(f"{path}: the patched manifest does not read back as the derived launch; its layout is "
                          f"not one fleetspec can edit in place")

"""Ansible inventories (static INI and YAML) read as fleetspec inventories.

Operators who run Ansible already list their hosts once; this maps that list onto fleetspec's
Host objects instead of asking for a second one. What is mapped:

- connection: ansible_host, ansible_port, ansible_user, ansible_ssh_private_key_file (and the
  older ansible_ssh_host/_port/_user), ansible_python_interpreter (the service's python unless
  fleetspec_python says otherwise);
- groups and children (a host is in every group above it), `all` and `ungrouped` implied;
- vars: inline group/host vars, then group_vars/ and host_vars/ folders beside the inventory
  (file or folder per name), with Ansible's order: all < parent groups < child groups (then by
  name) < host; folder files win over inline vars of the same group or host;
- fleetspec's own vars: `fleetspec_<var>` (python, service, api_port, model_path,
  draft_model_path, gpu_count, tags, api_key_env, known_hosts, host_key_policy, connect_timeout,
  command_timeout, jump; any other `fleetspec_<name>` lands in `extra`), or an overlay file
  `<inventory stem>.fleetspec.yaml` beside it (keys `defaults`, `vars`, `group_vars`,
  `host_vars`, in fleetspec's own names), which wins over both.

Refused with one line (exit 2): dynamic inventory scripts (an executable with a `#!`), vault-
encrypted values or files, Jinja templates in a value fleetspec uses, host ranges.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from fleetspec.errors import ConfigError, UserError
from fleetspec.model.ansible_host import _host_entry
from fleetspec.model.yamlload import PureStrictLoader, StrictLoader, load

OVERLAY_SUFFIX = ".fleetspec.yaml"


class _Vault(str):
    """A `!vault` value: refused wherever it is found."""


class AnsibleLoader(StrictLoader):
    """StrictLoader that knows Ansible's `!vault` and `!unsafe` tags."""


class PureAnsibleLoader(PureStrictLoader):
    """AnsibleLoader's pure-Python twin, for its clearer errors."""


def _vault(loader: AnsibleLoader, node: yaml.ScalarNode) -> _Vault:
    return _Vault(loader.construct_scalar(node))


def _unsafe(loader: AnsibleLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


for _loader in (AnsibleLoader, PureAnsibleLoader):
    _loader.add_constructor("!vault", _vault)
    _loader.add_constructor("!unsafe", _unsafe)


# ---- what kind of file is it -------------------------------------------------------------------

def refuse_dynamic(path: Path) -> None:
    """An executable with a shebang (or a binary) is a dynamic inventory script: never run it."""
    try:
        st = path.stat()
        head = path.read_bytes()[:4]
    except OSError:
        return
    if st.st_mode & 0o111 and (head.startswith(b"#!") or head.startswith(b"\x7fELF")):
        raise UserError(f"{path}: a dynamic Ansible inventory (an executable script) is not supported; "
                        f"save its output with `ansible-inventory -i {path} --list --yaml > hosts.yaml` and use that")


def _yaml(path: Path, text: str) -> Any:
    if text.lstrip().startswith("$ANSIBLE_VAULT"):
        raise UserError(f"{path}: vault-encrypted file; fleetspec does not decrypt Ansible vault "
                        f"(decrypt it, or move secrets to environment variables)")
    try:
        return load(text, AnsibleLoader, PureAnsibleLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        raise ConfigError(path, f"line {mark.line + 1}" if mark else None,
                          f"invalid YAML: {err.problem or err.context}") from None
    except yaml.YAMLError as err:
        raise ConfigError(path, None, f"invalid YAML: {err}") from None


_INI_HEADER = re.compile(r"(?m)^\s*\[[^\]]+\]\s*(?:[#;].*)?$")


def detect(path: Path) -> str:
    """'native', 'yaml' (Ansible YAML) or 'ini' (Ansible INI)."""
    refuse_dynamic(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix in (".ini", ".cfg"):
        return "ini"
    try:
        data = yaml.load(text, Loader=AnsibleLoader)
    except yaml.YAMLError:
        # Not YAML: an INI inventory if it has a section header, else the native loader says why.
        return "ini" if _INI_HEADER.search(text) else "native"
    if isinstance(data, dict):
        if "defaults" in data or isinstance(data.get("hosts"), dict) and all(
                isinstance(v, dict) and "address" in v for v in data["hosts"].values()):
            return "native"
        if data and all(isinstance(v, dict) and set(v) <= {"hosts", "children", "vars"} or v is None
                        for v in data.values()):
            return "yaml"
        return "native"      # let the native loader name what is wrong
    if text.lstrip().startswith("$ANSIBLE_VAULT"):
        return "yaml"
    if isinstance(data, list):          # `[gpu]` alone is a YAML list too
        return "ini" if _INI_HEADER.search(text) else "native"
    return "ini" if data is None or isinstance(data, str) else "native"


# ---- the group tree ------------------------------------------------------------------------------

class _Tree:
    def __init__(self, path: Path):
        self.path = path
        self.hosts: dict[str, dict[str, Any]] = {}    # host -> inline vars (merged if listed twice)
        self.groups: dict[str, dict[str, Any]] = {"all": {"hosts": [], "children": [], "vars": {}}}

    def group(self, name: str) -> dict[str, Any]:
        if not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", name):
            raise ConfigError(self.path, name, "group names are letters, digits, '.', '_' or '-'")
        return self.groups.setdefault(name, {"hosts": [], "children": [], "vars": {}})

    def add_host(self, group: str, name: str, hvars: dict[str, Any], key: str) -> None:
        if re.search(r"\[[^\]]*:[^\]]*\]", name):
            raise ConfigError(self.path, key, f"host ranges like {name!r} are not supported; list the hosts")
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
            raise ConfigError(self.path, key, f"host name {name!r}: letters, digits, '.', '_' or '-'")
        self.hosts.setdefault(name, {}).update(hvars)
        g = self.group(group)
        if name not in g["hosts"]:
            g["hosts"].append(name)

    def add_child(self, parent: str, child: str) -> None:
        self.group(child)
        p = self.group(parent)
        if child not in p["children"]:
            p["children"].append(child)


def _ini_value(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw


def _parse_ini(path: Path, tree: _Tree) -> None:
    section, kind = "ungrouped", "hosts"
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        stripped = line.strip()
        key = f"line {number}"
        if not stripped or stripped[0] in "#;":
            continue
        m = re.match(r"^\[([^\]:]+)(?::(vars|children))?\]\s*(?:[#;].*)?$", stripped)
        if m:
            section, kind = m[1], m[2] or "hosts"
            tree.group(section)
            continue
        if stripped.startswith("["):
            raise ConfigError(path, key, f"unknown section header {stripped!r}")
        if kind == "children":
            tree.add_child(section, stripped.split()[0])
            continue
        try:
            words = shlex.split(stripped, comments=True)
        except ValueError as err:
            raise ConfigError(path, key, f"cannot split {stripped!r}: {err}") from None
        if kind == "vars":
            name, eq, raw = stripped.partition("=")
            if not eq:
                raise ConfigError(path, key, f"expected name=value in [{section}:vars], got {stripped!r}")
            tree.group(section)["vars"][name.strip()] = _ini_value(raw.strip())
            continue
        hvars = {}
        for word in words[1:]:
            name, eq, raw = word.partition("=")
            if not eq:
                raise ConfigError(path, key, f"expected name=value after the host name, got {word!r}")
            hvars[name] = _ini_value(raw)
        tree.add_host(section, words[0], hvars, key)


def _parse_yaml(path: Path, data: dict[str, Any], tree: _Tree) -> None:
    def walk(name: str, body: Any, key: str) -> None:
        if body is None:
            tree.group(name)
            return
        if not isinstance(body, dict) or not set(body) <= {"hosts", "children", "vars"}:
            raise ConfigError(path, key, "expected a group: a mapping with hosts, children and/or vars")
        g = tree.group(name)
        gv = body.get("vars") or {}
        if not isinstance(gv, dict):
            raise ConfigError(path, f"{key}.vars", "expected a mapping of variables")
        g["vars"].update(gv)
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise ConfigError(path, f"{key}.hosts", "expected a mapping of host names (each with vars or empty)")
        for h, hv in hosts.items():
            if hv is not None and not isinstance(hv, dict):
                raise ConfigError(path, f"{key}.hosts.{h}", "expected a mapping of host vars, or nothing")
            tree.add_host(name, str(h), dict(hv or {}), f"{key}.hosts.{h}")
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise ConfigError(path, f"{key}.children", "expected a mapping of child groups")
        for child, cbody in children.items():
            tree.add_child(name, str(child))
            walk(str(child), cbody, f"{key}.children.{child}")

    for name, body in data.items():
        walk(str(name), body, str(name))


# ---- group_vars/ host_vars/ folders --------------------------------------------------------------

def _folder_vars(base: Path, name: str) -> dict[str, Any]:
    """<base>/<name>(.yml|.yaml|.json) and every such file in <base>/<name>/, in name order."""
    found: list[Path] = []
    for ext in ("", ".yml", ".yaml", ".json"):
        p = base / f"{name}{ext}"
        if p.is_file():
            found.append(p)
        elif ext == "" and p.is_dir():
            found += sorted(q for q in p.iterdir() if q.is_file() and q.suffix in (".yml", ".yaml", ".json", ""))
    out: dict[str, Any] = {}
    for p in found:
        data = _yaml(p, p.read_text(encoding="utf-8", errors="replace"))
        if data is None:
            continue
        if not isinstance(data, dict):
            raise ConfigError(p, None, "expected a mapping of variables")
        out.update(data)
    return out


def _check_vault(path: Path, where: str, values: dict[str, Any]) -> None:
    for k, v in values.items():
        if isinstance(v, _Vault) or isinstance(v, str) and v.lstrip().startswith("$ANSIBLE_VAULT"):
            raise UserError(f"{path}: {where}.{k} is vault-encrypted; fleetspec does not decrypt Ansible vault "
                            f"(use an environment variable: fleetspec_api_key_env)")
        if isinstance(v, dict):
            _check_vault(path, f"{where}.{k}", v)


# ---- to fleetspec's own inventory data -----------------------------------------------------------

def native_data(path: Path) -> dict[str, Any] | None:
    """The inventory as fleetspec's own data (see DEVELOPING.md), or None for a native file."""
    kind = detect(path)
    if kind == "native":
        return None
    tree = _Tree(path)
    if kind == "ini":
        _parse_ini(path, tree)
    else:
        data = _yaml(path, path.read_text(encoding="utf-8", errors="replace")) or {}
        _parse_yaml(path, data, tree)
    if not tree.hosts:
        raise ConfigError(path, None, "no hosts in this Ansible inventory")

    for g in tree.groups:
        if g != "all" and g not in tree.groups["all"]["children"] and not _has_parent(tree, g):
            tree.groups["all"]["children"].append(g)
    parents = _parents(tree)
    depth = {g: _depth(g, parents) for g in tree.groups}
    members = {g: _members(tree, g) for g in tree.groups}
    for g, body in tree.groups.items():
        body["vars"] = {**body["vars"], **_folder_vars(path.parent / "group_vars", g)}
        _check_vault(path, f"group {g}", body["vars"])
    overlay = _overlay(path)

    hosts: dict[str, dict[str, Any]] = {}
    for name, inline in tree.hosts.items():
        in_groups = [g for g in tree.groups if name in members[g]]
        merged: dict[str, Any] = {}
        for g in sorted(in_groups, key=lambda g: (depth[g], g)):
            merged.update(tree.groups[g]["vars"])
        merged.update(inline)
        merged.update(_folder_vars(path.parent / "host_vars", name))
        _check_vault(path, f"host {name}", merged)
        hosts[name] = _host_entry(path, name, merged, in_groups, depth, overlay)
    # Parents before children, else in order of appearance: the same groups whichever syntax.
    order = sorted(tree.groups, key=lambda g: (depth[g], list(tree.groups).index(g)))
    groups = {g: [h for h in tree.hosts if h in members[g]] for g in order
              if g not in ("all", "ungrouped") and members[g]}
    return {"hosts": hosts, "groups": groups}


def _has_parent(tree: _Tree, g: str) -> bool:
    return any(g in body["children"] for body in tree.groups.values())


def _parents(tree: _Tree) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {g: [] for g in tree.groups}
    for g, body in tree.groups.items():
        for c in body["children"]:
            out[c].append(g)
    return out


def _depth(g: str, parents: dict[str, Any], seen: tuple[str, ...] = ()) -> int:
    if g == "all" or g in seen:
        return 0
    return 1 + max((_depth(p, parents, (*seen, g)) for p in parents[g]), default=0)


def _members(tree: _Tree, g: str, seen: tuple[str, ...] = ()) -> list[str]:
    if g == "all":
        return list(tree.hosts)
    if g in seen:
        raise ConfigError(tree.path, g, f"group {g!r} is its own child (children loop)")
    out = list(tree.groups[g]["hosts"])
    for c in tree.groups[g]["children"]:
        out += [h for h in _members(tree, c, (*seen, g)) if h not in out]
    return out


def _overlay(path: Path) -> dict[str, Any]:
    p = path.with_name(path.stem + OVERLAY_SUFFIX)
    if not p.is_file():
        return {}
    data = _yaml(p, p.read_text(encoding="utf-8", errors="replace")) or {}
    if not isinstance(data, dict) or not set(data) <= {"defaults", "vars", "group_vars", "host_vars"}:
        raise ConfigError(p, None, "expected a mapping with defaults, vars, group_vars and/or host_vars")
    for key in data:
        if not isinstance(data[key], dict):
            raise ConfigError(p, key, "expected a mapping")
    data["_path"] = p
    return data

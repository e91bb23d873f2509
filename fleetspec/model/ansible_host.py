"""One host of a static Ansible inventory in fleetspec's own inventory shape (pure): its
connection vars, its fleetspec_* vars and the <stem>.fleetspec.yaml overlay. The group tree and
the files are read by model/ansible_inventory.py."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from fleetspec import secrets
from fleetspec.errors import ConfigError, UserError

SECRET_KEYS = secrets.ANSIBLE_KEYS
FLEETSPEC_VARS = ("python", "service", "api_port", "model_path", "draft_model_path", "gpu_count", "tags", "extra")
CONNECTION = ("known_hosts", "host_key_policy", "connect_timeout", "command_timeout", "jump", "ssh_key", "user", "port")


def _text(path: Path, name: str, key: str, value: object) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(path, f"{name}.{key}", f"expected a string, got {type(value).__name__}")
    value = str(value)
    if "{{" in value or "{%" in value:
        raise UserError(f"{path}: {name}.{key} is a Jinja template ({value!r}); fleetspec does not render "
                        f"Ansible templates: give the value itself (or set fleetspec_{key.removeprefix('ansible_')})")
    return value


def _int(path: Path, name: str, key: str, value: Any) -> int:
    try:
        return int(_text(path, name, key, value))
    except ValueError:
        raise ConfigError(path, f"{name}.{key}", f"expected a whole number, got {value!r}") from None


def _proxy_jump(path: Path, name: str, args: str) -> str | None:
    """`-J host` or `-o ProxyJump=host` in ansible_ssh_common_args/extra_args: fleetspec's jump.
    A ProxyCommand would run a program fleetspec cannot: refused."""
    if "proxycommand" in args.lower():
        raise UserError(f"{path}: {name}: ProxyCommand in ansible_ssh_common_args is not supported; "
                        f"use ProxyJump (or fleetspec_jump: user@host:port)")
    m = re.search(r"(?:-J\s*|ProxyJump[=\s]\s*)([^\s'\"]+)", args, re.IGNORECASE)
    if m and "," in m[1]:
        raise UserError(f"{path}: {name}: a chain of jump hosts ({m[1]}) is not supported; one jump host only")
    return m[1] if m else None


def _host_entry(path: Path, name: str, v: dict[str, Any], in_groups: list[str], depth: dict[str, Any],
                overlay: dict[str, Any]) -> dict[str, Any]:
    """One host in fleetspec's own inventory shape, from its merged Ansible vars."""
    entry = _connection(path, name, v)
    hvars, extra = _fleetspec_vars(path, name, v, entry)
    if overlay:
        _apply_overlay(overlay, name, in_groups, depth, entry, hvars, extra)
    if extra:
        hvars["extra"] = {**(hvars.get("extra") or {}), **extra}
    entry.setdefault("known_hosts", str(Path(os.path.expanduser("~/.ssh/known_hosts"))))
    for key in ("ssh_key", "known_hosts"):
        if key in entry:
            p = Path(str(entry[key])).expanduser()
            entry[key] = str(p if p.is_absolute() else (path.parent / p).resolve())
    entry["vars"] = hvars
    ignored = [k for k in SECRET_KEYS if k in v]
    if ignored:
        entry["_ignored_secrets"] = ignored
    return entry


def _connection(path: Path, name: str, v: dict[str, Any]) -> dict[str, Any]:
    """address, port, user, ssh_key and jump from the ansible_* connection vars (SSH only)."""
    entry: dict[str, Any] = {}
    conn_keys = {"address": ("ansible_host", "ansible_ssh_host"), "port": ("ansible_port", "ansible_ssh_port"),
                 "user": ("ansible_user", "ansible_ssh_user"), "ssh_key": ("ansible_ssh_private_key_file",)}
    for field, keys in conn_keys.items():
        for k in keys:
            if k in v:
                entry[field] = _int(path, name, k, v[k]) if field == "port" else _text(path, name, k, v[k])
                break
    entry.setdefault("address", name)
    connection = str(v.get("ansible_connection", "ssh"))
    if connection not in ("ssh", "smart", "paramiko"):
        raise UserError(f"{path}: {name}: ansible_connection={connection} is not supported; fleetspec reaches "
                        f"hosts over SSH only")
    jump = _proxy_jump(path, name, " ".join(str(v.get(k, "")) for k in ("ansible_ssh_common_args",
                                                                          "ansible_ssh_extra_args")))
    if jump:
        entry["jump"] = jump
    if "ssh_key" in entry:
        p = Path(entry["ssh_key"]).expanduser()
        entry["ssh_key"] = str(p if p.is_absolute() else (path.parent / p).resolve())
    return entry


def _fleetspec_vars(path: Path, name: str, v: dict[str, Any],
                    entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(vars, extra) from ansible_python_interpreter and the fleetspec_* vars; connection keys go to `entry`."""
    hvars: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if "ansible_python_interpreter" in v:
        hvars["python"] = _text(path, name, "ansible_python_interpreter", v["ansible_python_interpreter"])
    for k, value in v.items():
        if not k.startswith("fleetspec_"):
            continue
        short = k.removeprefix("fleetspec_")
        if isinstance(value, str):
            _text(path, name, k, value)
        if short in CONNECTION:
            entry[short] = value
        elif short == "api_key_env":
            hvars["api_key"] = {"secret_env": value}
        elif short == "extra":
            if not isinstance(value, dict):
                raise ConfigError(path, f"{name}.{k}", "expected a mapping")
            extra.update(value)
        elif short in FLEETSPEC_VARS:
            hvars[short] = value
        else:
            extra[short] = value
    return hvars, extra


def _apply_overlay(overlay: dict[str, Any], name: str, in_groups: list[str], depth: dict[str, Any],
                   entry: dict[str, Any], hvars: dict[str, Any], extra: dict[str, Any]) -> None:
    """The <stem>.fleetspec.yaml beside the inventory: its defaults, then vars by group depth, then the host's."""
    src = overlay["_path"]
    for key, value in (overlay.get("defaults") or {}).items():
        if key not in CONNECTION:
            raise ConfigError(src, f"defaults.{key}", f"unknown key (known: {', '.join(CONNECTION)})")
        entry.setdefault(key, value) if key in ("ssh_key", "user", "port") else entry.__setitem__(key, value)
    layers = [overlay.get("vars") or {}]
    layers += [(overlay.get("group_vars") or {}).get(g) or {} for g in sorted(in_groups, key=lambda g: (depth[g], g))]
    layers.append((overlay.get("host_vars") or {}).get(name) or {})
    for layer in layers:
        for key, value in layer.items():
            if key == "extra" and isinstance(value, dict):
                extra.update(value)
            else:
                hvars[key] = value

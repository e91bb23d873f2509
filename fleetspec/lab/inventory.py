"""`inventory/lab.yaml`: the lab's hosts in fleetspec's inventory format (DEVELOPING.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fleetspec.lab import profiles

HEADER = "# Written by `fleetspec lab up`; rewritten on every run. Do not edit.\n"


def render(hosts: dict[str, str]) -> str:
    """hosts: name -> address."""
    data: dict[str, Any] = {
        "defaults": {
            "user": "root", "port": 22,
            "ssh_key": "../.lab/ssh/id_ed25519", "known_hosts": "../.lab/ssh/known_hosts",
            "host_key_policy": "strict", "connect_timeout": 10, "command_timeout": 300,
            "vars": {"service": profiles.SERVICE, "api_port": profiles.API_PORT},
        },
        "groups": {"lab": sorted(hosts)},
        "hosts": {},
    }
    groups = data["groups"]
    for name in sorted(hosts):
        p = profiles.for_host(name)
        data["hosts"][name] = {"address": hosts[name], "port": 22, "vars": profiles.inventory_vars(p)}
        groups.setdefault("gpu", []).append(name)
        groups.setdefault(f"sglang-{p.version.replace('.', '-')}", []).append(name)
        for tag in p.tags:
            groups.setdefault(tag, []).append(name)
    return HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def write(root: Path, hosts: dict[str, str]) -> Path:
    path = root / "inventory" / "lab.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(render(hosts))
    tmp.replace(path)
    return path


def remove(root: Path) -> None:
    (root / "inventory" / "lab.yaml").unlink(missing_ok=True)

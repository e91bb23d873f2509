"""`fleetspec inventory show`: the inventory as fleetspec resolved it (Ansible ones included)."""

from __future__ import annotations

import json

import click

from fleetspec.cli.completion import complete_targets


def host_view(h) -> dict:
    """What an operator checks about one host; secrets only by the name that holds them."""
    v = h.vars
    api_key = None
    if v.api_key is not None:
        api_key = f"from ${v.api_key.env} ({'set' if v.api_key.value() else 'not set here'}; value redacted)"
    return {
        "address": h.address, "port": h.port, "user": h.user,
        "ssh_key": str(h.ssh_key) if h.ssh_key else "(agent, then ~/.ssh/id_*)",
        "known_hosts": str(h.known_hosts) if h.known_hosts else None, "host_key_policy": h.host_key_policy,
        "connect_timeout": h.connect_timeout, "command_timeout": h.command_timeout,
        "jump": str(h.jump) if h.jump else None, "groups": list(h.groups),
        "vars": {"python": v.python, "service": v.service, "api_port": v.api_port, "model_path": v.model_path,
                 "draft_model_path": v.draft_model_path, "gpu_count": v.gpu_count, "tags": list(v.tags),
                 "api_key": api_key, "extra": dict(v.extra)},
    }


@click.group("inventory")
def inventory_group():
    """Inspect the inventory: fleetspec's own YAML or a static Ansible one (INI or YAML)."""


@inventory_group.command("show")
@click.argument("targets", nargs=-1, shell_complete=complete_targets)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host per line.")
@click.pass_obj
def show(obj, targets, as_json):
    """Print each host as resolved: address, port, user, key, groups, fleetspec vars (secrets
    redacted), so the mapping from an Ansible inventory can be checked before any connection.

    \b
    Example: fleetspec -i ~/ansible/hosts.ini inventory show @gpu
    """
    from fleetspec.cli.history_cmd import pretty
    from fleetspec.cli.output import Out, echo
    from fleetspec.model.ansible_host import SECRET_KEYS
    from fleetspec.model.ansible_inventory import detect, native_data

    inv = obj.inv
    hosts = obj.select(targets, False, default_all=True)
    ignored = {}
    kind = detect(inv.path)
    data = native_data(inv.path) if kind != "native" else None
    if data is not None:
        ignored = {n: e.get("_ignored_secrets", []) for n, e in data["hosts"].items()}
    if as_json:
        for h in hosts:
            echo(json.dumps({"host": h.name, **host_view(h), "ignored_secrets": ignored.get(h.name, [])},
                            sort_keys=True, default=str))
        return
    out = Out()
    label = {"native": "fleetspec inventory", "ini": "Ansible INI inventory", "yaml": "Ansible YAML inventory"}[kind]
    out.line(f"{inv.path} ({label}): {len(inv.hosts)} hosts, groups: "
             f"{', '.join('@' + g for g in inv.groups) or 'none'}", [(0, len(str(inv.path)), "bold")])
    for h in hosts:
        out.line()
        out.line(h.name, [(0, len(h.name), "bold")])
        for ln in pretty(None, host_view(h), out.width, "  "):
            out.line(ln)
        if ignored.get(h.name):
            out.line(f"  not used (fleetspec connects with keys only; values not shown): "
                     f"{', '.join(k for k in ignored[h.name] if k in SECRET_KEYS)}")


COMMANDS = [inventory_group]

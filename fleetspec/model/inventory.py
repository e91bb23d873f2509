"""The inventory: which hosts exist, how to reach them, and the facts about them we cannot probe.

Loaded from `inventory/*.yaml` (schema in DEVELOPING.md) into frozen dataclasses; every mistake is
one ConfigError naming the file and key. Vars merge defaults < groups (in file order) < host.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from fleetspec.errors import ConfigError, UserError
from fleetspec.model import known_hosts
from fleetspec.model.names import is_service
from fleetspec.model.router import RouterSpec, parse_routers
from fleetspec.model.yamlload import Fields, Kind, describe, load_yaml_file

POLICIES = ("strict", "accept-new")
BECOME = ("sudo", "none")         # how a user other than root acts as root on the host
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")      # fullmatch: `$` would let a trailing newline in
_JUMP = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<host>[^@\s:\[\]]+|\[[0-9a-fA-F:.]+\])(?::(?P<port>\d+))?$")


@dataclass(frozen=True)
class SecretRef:
    """A value read from the environment at use time, so the inventory never holds the secret."""

    env: str

    def value(self) -> str | None:
        return os.environ.get(self.env)

    def __repr__(self) -> str:
        return f"SecretRef(env={self.env!r})"


@dataclass(frozen=True)
class HostVars:
    python: str = "/root/ml-env/bin/python3"
    service: str = "sglang.service"
    api_port: int = 30000
    model_path: str | None = None
    draft_model_path: str | None = None
    gpu_count: int | None = None
    tags: tuple[str, ...] = ()
    api_key: SecretRef | None = None
    router: str | None = None          # a name under the inventory's `routers:`
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __hash__(self) -> int:  # `extra` is a mapping; hash the rest so hosts can key dicts
        return hash((self.python, self.service, self.api_port, self.model_path, self.tags))

    def template_view(self) -> dict[str, Any]:
        """What templates and playbook expressions see as `host.*` (secrets stay references)."""
        view = dict(self.extra)
        view.update(python=self.python, service=self.service, api_port=self.api_port,
                    model_path=self.model_path, draft_model_path=self.draft_model_path,
                    gpu_count=self.gpu_count, tags=list(self.tags))
        return view


VAR_KINDS: dict[str, Kind] = {
    "python": str, "service": str, "api_port": int, "model_path": str, "draft_model_path": str,
    "gpu_count": int, "tags": list, "api_key": dict, "router": str, "extra": dict,
}


@dataclass(frozen=True)
class JumpHost:
    address: str
    port: int = 22
    user: str | None = None
    port_given: bool = True      # False: no port written, so ssh_config's Port for it applies

    def __str__(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.address}:{self.port}"


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int = 22
    user: str = "root"
    become: str = "none"
    ssh_key: Path | None = None
    known_hosts: Path | None = None
    host_key_policy: str = "strict"
    connect_timeout: float = 10.0
    command_timeout: float = 300.0
    jump: JumpHost | None = None
    vars: HostVars = field(default_factory=HostVars)
    groups: tuple[str, ...] = ()
    inventory_path: Path | None = None
    ssh_config: Path | None = None                 # read at connect (remote/ssh_config.py); None: none
    inventory_sets: frozenset[str] = frozenset()   # connection keys the inventory wrote: they win over ssh_config

    def __hash__(self) -> int:
        return hash((self.name, self.address, self.port, self.user))

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH writes this host in known_hosts: bare for port 22, else `[addr]:port`."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    @property
    def is_hybrid_tagged(self) -> bool:
        return "hybrid" in self.vars.tags


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: Mapping[str, Host]
    groups: Mapping[str, tuple[str, ...]]
    routers: Mapping[str, RouterSpec] = field(default_factory=lambda: MappingProxyType({}))

    def router_of(self, host: Host) -> RouterSpec | None:
        return self.routers.get(host.vars.router) if host.vars.router else None

    def worker_url(self, host: Host) -> str | None:
        spec = self.router_of(host)
        return spec.worker_for(host.name, host.address, host.vars.api_port) if spec else None

    def select(self, tokens: Iterable[str] = (), all_hosts: bool = False) -> list[Host]:
        """Hosts named by host patterns (model/hostpattern.py: `name`, `@group`, globs, ranges,
        `!`/`&` terms) or all of them, in inventory order, each once."""
        from fleetspec.model import hostpattern

        tokens = list(tokens)
        if all_hosts:
            return list(self.hosts.values())
        if not tokens:
            return []
        names = hostpattern.select(tokens, list(self.hosts), self.groups, str(self.path))
        return [self.hosts[n] for n in names]


INVENTORY_SUFFIXES = (".yaml", ".yml", ".ini")


def inventory_files(inv_dir: Path) -> list[Path]:
    """The inventories a bare command could mean: each YAML or INI file directly in inventory/,
    but the examples (`example-*`)."""
    if not inv_dir.is_dir():
        return []
    return sorted(p for p in inv_dir.iterdir()
                  if p.suffix in INVENTORY_SUFFIXES and p.is_file() and not p.name.startswith("example"))


def resolve_inventory_path(root: Path, name: str | None = None) -> Path:
    """-i NAME|PATH > $FLEETSPEC_INVENTORY > the one inventory in inventory/. Never a silent
    choice: with several there (lab.yaml beside production.yaml, both naming ct129), or none, it
    refuses and names them; the lab's `lab down` removing lab.yaml then never turns a bare
    command onto production unless production is the only inventory left."""
    name = name or os.environ.get("FLEETSPEC_INVENTORY")
    inv_dir = Path(root) / "inventory"
    if name:
        candidates = [Path(name).expanduser()]
        if "/" not in name:
            candidates = [inv_dir / name, inv_dir / f"{name}.yaml", inv_dir / f"{name}.yml", inv_dir / f"{name}.ini",
                          *candidates]
        for candidate in candidates:
            if candidate.is_file():
                return candidate.resolve()
        raise UserError(f"inventory {name!r} not found (looked in {inv_dir} and as a path)")
    found = inventory_files(inv_dir)
    if len(found) == 1:
        return found[0].resolve()
    if not found:
        raise UserError(f"no inventory: {inv_dir} has no .yaml, .yml or .ini file (write one, or use -i PATH)")
    names = ", ".join(p.name for p in found)
    raise UserError(f"{inv_dir} has {len(found)} inventories ({names}): name one with -i "
                    f"(e.g. -i {found[0].stem}) or FLEETSPEC_INVENTORY")


def load_inventory(path: str | Path) -> Inventory:
    """fleetspec's own YAML, or a static Ansible inventory (INI or YAML; model/ansible_inventory.py)."""
    from fleetspec.model.ansible_inventory import native_data

    path = Path(path)
    data = native_data(path) if path.is_file() else None
    if data is not None:
        for entry in data["hosts"].values():
            entry.pop("_ignored_secrets", None)
    top = Fields(load_yaml_file(path) if data is None else data, path)
    defaults = top.sub("defaults")
    groups_f = top.sub("groups")
    group_vars_f = top.sub("group_vars")
    hosts_f = top.sub("hosts", required=True)
    routers = parse_routers(top.sub("routers"), path)
    top.done()

    base = _connection_fields(defaults, path, {})
    base_vars = dict(defaults.sub("vars").data)
    _check_vars(defaults.sub("vars"))
    defaults.done()

    raw_hosts = hosts_f.data
    if not raw_hosts:
        hosts_f.fail(None, "expected at least one host")
    for name in raw_hosts:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            hosts_f.fail(str(name), "host names are letters, digits, '.', '_' or '-'")
    groups = _groups(groups_f, raw_hosts, path)
    group_vars = _group_vars(group_vars_f, groups)
    hosts = _hosts(hosts_f, raw_hosts, groups, group_vars, base, base_vars, path)
    for name, host in hosts.items():
        if host.vars.router is not None and host.vars.router not in routers:
            known = ", ".join(routers) or "none under routers"
            raise ConfigError(path, f"hosts.{name}.vars.router", f"unknown router {host.vars.router!r} (known: {known})")
    return Inventory(path=path.resolve(), hosts=MappingProxyType(hosts), groups=MappingProxyType(groups),
                     routers=MappingProxyType(dict(routers)))


def _groups(groups_f: Fields, raw_hosts: Mapping[str, Any], path: Path) -> dict[str, tuple[str, ...]]:
    """Each group's members, each a host under hosts (`all` is Ansible's, not a name here)."""
    groups: dict[str, tuple[str, ...]] = {}
    for gname, members in groups_f.data.items():
        key = groups_f.key(str(gname))
        if not isinstance(gname, str) or not _NAME.fullmatch(gname) or gname == "all":
            raise ConfigError(path, key, "group names are letters, digits, '.', '_' or '-' (not 'all')")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ConfigError(path, key, f"expected a list of host names, got {describe(members)}")
        for i, member in enumerate(members):
            if member not in raw_hosts:
                raise ConfigError(path, f"{key}[{i}]", f"unknown host {member!r} (not under hosts)")
        groups[gname] = tuple(dict.fromkeys(members))
    return groups


def _group_vars(group_vars_f: Fields, groups: Mapping[str, tuple[str, ...]]) -> dict[str, dict[str, Any]]:
    group_vars: dict[str, dict[str, Any]] = {}
    for gname in group_vars_f.data:
        if gname not in groups:
            group_vars_f.fail(str(gname), "no such group under groups")
        sub = group_vars_f.sub(gname)
        _check_vars(sub)
        group_vars[gname] = dict(sub.data)
    group_vars_f.done()
    return group_vars


def _hosts(hosts_f: Fields, raw_hosts: Mapping[str, Any], groups: Mapping[str, tuple[str, ...]],
           group_vars: dict[str, dict[str, Any]], base: dict[str, Any], base_vars: dict[str, Any],
           path: Path) -> dict[str, Host]:
    """Each host, its vars merged: defaults, then its groups' vars in order, then its own."""
    hosts: dict[str, Host] = {}
    for name in raw_hosts:
        f = hosts_f.sub(name, required=True)
        member_of = tuple(g for g, m in groups.items() if name in m)
        merged = dict(base_vars)
        for g in member_of:
            merged.update(group_vars.get(g, {}))
        own = f.sub("vars")
        _check_vars(own)
        merged.update(own.data)
        conn = _connection_fields(f, path, base)
        address = f.get("address", str, name)        # without one, the name (an ~/.ssh/config alias, as for ssh)
        jump_text = f.get("jump", str, None)
        conn["inventory_sets"] = conn["inventory_sets"] | ({"jump"} if jump_text is not None else set())
        f.done()
        hosts[name] = Host(
            name=name, address=address, jump=_parse_jump(jump_text, path, f.key("jump")),
            vars=_build_vars(merged, path, f"hosts.{name}.vars"), groups=member_of,
            inventory_path=path.resolve(), **conn,
        )
    return hosts


def _connection_fields(f: Fields, path: Path, base: dict[str, Any]) -> dict[str, Any]:
    """user, port, keys, policy and timeouts; relative paths are relative to the inventory file.
    `inventory_sets`: which of user, port, ssh_key, become this file wrote (here or in defaults)."""
    out = dict(base)
    out["inventory_sets"] = frozenset(base.get("inventory_sets", frozenset())) | {
        k for k in ("user", "port", "ssh_key", "become") if k in f.data}
    out["user"] = f.get("user", str, out.get("user", "root"))
    out["become"] = _become(f, base, out["user"])
    port = f.get("port", int, out.get("port", 22))
    if not 1 <= port <= 65535:
        f.fail("port", f"expected a port number 1-65535, got {port}")
    out["port"] = port
    for key in ("ssh_key", "known_hosts"):
        value = f.get(key, str, None)
        if value is not None:
            p = Path(value).expanduser()
            out[key] = (p if p.is_absolute() else path.parent / p).resolve()
        else:
            out.setdefault(key, None)
    if out.get("ssh_key") is not None and "ssh_key" in f.data and not out["ssh_key"].is_file():
        f.fail("ssh_key", f"key file {out['ssh_key']} not found")
    if out.get("known_hosts") is not None and "known_hosts" in f.data:
        why = known_hosts.problem(out["known_hosts"])
        if why:
            f.fail("known_hosts", f"expected a known_hosts file, got {why}")
    out["host_key_policy"] = f.choice("host_key_policy", POLICIES, out.get("host_key_policy", "strict"))
    config = f.get("ssh_config", str, None)
    if config is not None:
        p = Path(config).expanduser()
        out["ssh_config"] = None if config == "none" else (p if p.is_absolute() else path.parent / p).resolve()
    elif "ssh_config" not in out:
        out["ssh_config"] = Path("~/.ssh/config").expanduser()
    for key, default in (("connect_timeout", 10.0), ("command_timeout", 300.0)):
        value = f.get(key, float, out.get(key, default))
        if value <= 0:
            f.fail(key, f"expected a positive number of seconds, got {value}")
        out[key] = float(value)
    return out


def _become(f: Fields, base: dict[str, Any], user: str) -> str:
    """`sudo` (`sudo -n`, never a password) is the default for every user but root; fleetspec's
    files on a host are root's, so a non-root user with `become: none` could change nothing."""
    default = "none" if user == "root" else "sudo"
    inherited = base.get("become")
    if inherited == ("none" if base.get("user", "root") == "root" else "sudo"):
        inherited = None                      # the defaults' own default follows this host's user
    value = f.choice("become", BECOME, inherited or default)
    if value == "none" and user != "root":
        f.fail("become", f"expected sudo for user {user!r} (fleetspec writes root's files on the host; "
                         f"become: none needs user: root)")
    return value


def _check_vars(f: Fields) -> None:
    for key in f.data:
        if key not in VAR_KINDS:
            f.fail(str(key), f"unknown var (known: {', '.join(VAR_KINDS)}; put others under extra)")
        f.get(key, VAR_KINDS[key], None)
    f.done()


def _build_vars(merged: dict[str, Any], path: Path, key: str) -> HostVars:
    values = dict(merged)
    if "tags" in values:
        tags = values["tags"]
        if not all(isinstance(t, str) for t in tags):
            raise ConfigError(path, f"{key}.tags", "expected a list of strings")
        values["tags"] = tuple(tags)
    if "api_key" in values:
        spec = Fields(values["api_key"], path, f"{key}.api_key")
        env = spec.get("secret_env", str, required=True)
        spec.done()
        values["api_key"] = SecretRef(env)
    if "service" in values and not is_service(values["service"]):
        # It names /var/lib/fleetspec/<service>/, the unit's drop-in folder and the guard's %i:
        # no paths, no shell, no leading '-' (an option to systemctl), no systemd `\xNN` escapes.
        raise ConfigError(path, f"{key}.service",
                          f"expected a systemd unit name like sglang.service (letters, digits, @ : _ . -, "
                          f"starting with a letter or digit, no '..'), got {values['service']!r}")
    if "api_port" in values and not 1 <= values["api_port"] <= 65535:
        raise ConfigError(path, f"{key}.api_port", f"expected a port number 1-65535, got {values['api_port']}")
    if "extra" in values:
        waive = values["extra"].get("gpu_waive")
        if waive is not None:
            from fleetspec.model.gpuhealth import waiver_errors

            problem = waiver_errors(waive)
            if problem:
                raise ConfigError(path, f"{key}.extra.gpu_waive", problem)
        values["extra"] = MappingProxyType(dict(values["extra"]))
    return HostVars(**values)


def _parse_jump(text: str | None, path: Path, key: str) -> JumpHost | None:
    if text is None:
        return None
    m = _JUMP.match(text.strip())
    if not m:
        raise ConfigError(path, key, f"expected [user@]host[:port], got {text!r}")
    port = int(m["port"] or 22)
    if not 1 <= port <= 65535:
        raise ConfigError(path, key, f"expected a port number 1-65535, got {port}")
    return JumpHost(address=m["host"].strip("[]"), port=port, user=m["user"], port_given=m["port"] is not None)

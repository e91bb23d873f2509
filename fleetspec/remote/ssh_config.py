"""How to reach a host: the inventory's values over the operator's ssh_config (~/.ssh/config), as
OpenSSH reads it for `ssh <address>`.

The inventory's `address` is looked up as ssh's command-line host: `Host` patterns match it, and
`HostName`, `Port`, `User`, `IdentityFile` and `ProxyJump` apply unless the inventory wrote that
value itself (`port`, `user`, `ssh_key`, `jump`, in the host or in `defaults:`; the inventory is
the command line). Each ProxyJump hop is looked up the same way (its own HostName, Port, User,
IdentityFile and ProxyJump), as ssh does; `Include` is read in place. paramiko.SSHConfig parses
the file; `Match exec` (which would need `invoke`) is refused in one line. Pure except for reading
the config file.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

from fleetspec.errors import ConfigError
from fleetspec.model.inventory import Host
from fleetspec.remote.ssh_lib import paramiko

MAX_HOPS = 8
_INCLUDE_DEPTH = 16


@dataclass(frozen=True)
class Hop:
    """One SSH connection on the way: where to connect, as whom, with which keys (empty: the
    inventory's key, else the agent's and ~/.ssh/id_*)."""

    alias: str
    address: str
    port: int
    user: str
    keys: tuple[Path, ...] = ()

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH writes it in known_hosts: bare for port 22, else `[addr]:port`."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


@dataclass(frozen=True)
class Reach:
    target: Hop
    jumps: tuple[Hop, ...] = ()                       # outermost first
    applied: tuple[str, ...] = ()                     # what ssh_config set, e.g. "HostName gpu-a1.gpu.example"
    kept: tuple[str, ...] = ()                        # what the inventory set over ssh_config
    config: Path | None = None
    notes: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        """One line for -v: the route, and which values came from where."""
        route = str(self.target) + "".join(f" via {j}" for j in reversed(self.jumps))
        said = [f"{self.config}: {', '.join(self.applied)}"] if self.applied else []
        if self.kept:
            said.append(f"inventory over ssh_config: {', '.join(self.kept)}")
        return f"ssh {route}" + (f" ({'; '.join([*said, *self.notes])})" if said or self.notes else "")


def _inline(path: Path, depth: int = 0) -> str:
    """The file's text with each `Include` replaced by the files it names (relative paths from
    ~/.ssh, globs sorted), as OpenSSH reads them."""
    if depth > _INCLUDE_DEPTH:
        raise ConfigError(path, "Include", f"at most {_INCLUDE_DEPTH} nested Include levels")
    out = []
    for line in path.read_text(errors="replace").splitlines():
        words = line.strip().replace("=", " ", 1).split()
        if words and words[0].lower() == "include":
            for pattern in words[1:]:
                full = os.path.expanduser(pattern)
                full = full if os.path.isabs(full) else str(Path.home() / ".ssh" / full)
                for name in sorted(glob.glob(full)):
                    if os.path.isfile(name):
                        out.append(_inline(Path(name), depth + 1))
            continue
        out.append(line)
    return "\n".join(out)


_CACHE: dict[tuple[str, float], paramiko.SSHConfig] = {}


def load(path: Path | None) -> paramiko.SSHConfig | None:
    """The parsed config (cached per path and mtime), or None where there is none."""
    if path is None or not path.is_file():
        return None
    key = (str(path), path.stat().st_mtime)
    if key not in _CACHE:
        try:
            _CACHE[key] = paramiko.SSHConfig.from_text(_inline(path))
        except (OSError, ValueError, paramiko.SSHException) as err:
            raise ConfigError(path, None, f"an ssh_config paramiko can read ({err})") from None
    return _CACHE[key]


def _lookup(config: paramiko.SSHConfig | None, path: Path | None, alias: str) -> dict:
    if config is None:
        return {"hostname": alias}
    try:
        return dict(config.lookup(alias))
    except ImportError:          # paramiko's `Match exec` runs commands through invoke, which is not loaded
        raise ConfigError(path, f"Match exec (for {alias})", "no `Match exec` (fleetspec runs no local "
                          "commands to pick a Host block; use Host patterns)") from None


def _parse_hop(spec: str, path: Path | None) -> tuple[str | None, str, int | None]:
    """`[ssh://][user@]host[:port]` -> (user, host, port)."""
    text = spec.strip().removeprefix("ssh://")
    user, _, rest = text.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else None
    elif rest.count(":") == 1:
        host, _, p = rest.partition(":")
        if not p.isdigit():
            raise ConfigError(path, "ProxyJump", f"[user@]host[:port], got {spec!r}")
        port = int(p)
    if not host:
        raise ConfigError(path, "ProxyJump", f"[user@]host[:port], got {spec!r}")
    return user or None, host, port


def _keys(got: dict) -> tuple[Path, ...]:
    """IdentityFile entries that exist (ssh skips missing ones too)."""
    return tuple(Path(p) for p in got.get("identityfile", []) if Path(p).is_file())


def _hops(config, path, specs: str, fallback_user: str, depth: int = 0) -> list[Hop]:
    """The ProxyJump chain, outermost first; each hop's own ProxyJump comes before it."""
    out: list[Hop] = []
    for spec in specs.split(","):
        user, alias, port = _parse_hop(spec, path)
        got = _lookup(config, path, alias)
        inner = got.get("proxyjump")
        if inner and inner.lower() != "none":
            if depth >= MAX_HOPS:
                raise ConfigError(path, "ProxyJump", f"a chain of at most {MAX_HOPS} hops (a loop at {alias}?)")
            out.extend(_hops(config, path, inner, fallback_user, depth + 1))
        out.append(Hop(alias, got.get("hostname", alias), port or int(got.get("port", 22)),
                       user or got.get("user") or fallback_user, _keys(got)))
    if len(out) > MAX_HOPS:
        raise ConfigError(path, "ProxyJump", f"a chain of at most {MAX_HOPS} hops")
    return out


def reach(host: Host) -> Reach:
    """The route to `host`: the inventory's values where it wrote them, else ssh_config's, else
    ssh's defaults (port 22) and fleetspec's (user root, the agent's keys)."""
    path = host.ssh_config
    config = load(path)
    got = _lookup(config, path, host.address)
    sets = host.inventory_sets
    applied: list[str] = []
    kept: list[str] = []

    def pick(key: str, inventory_key: str, inventory_value, default):
        if inventory_key in sets:
            if key in got:
                kept.append(inventory_key)
            return inventory_value
        if key in got:
            applied.append(f"{key} {' '.join(got[key]) if isinstance(got[key], list) else got[key]}")
            return got[key]
        return default

    address = got.get("hostname", host.address)
    if address != host.address:
        applied.append(f"hostname {address}")
    port = int(pick("port", "port", host.port, host.port))
    user = str(pick("user", "user", host.user, host.user))
    keys: tuple[Path, ...] = (host.ssh_key,) if "ssh_key" in sets and host.ssh_key else ()
    if "ssh_key" in sets and "identityfile" in got:
        kept.append("ssh_key")
    elif "ssh_key" not in sets and _keys(got):
        keys = _keys(got)
        applied.append("identityfile " + " ".join(map(str, keys)))
    jumps: list[Hop] = []
    proxy = got.get("proxyjump")
    if "jump" in sets and host.jump is not None:
        if proxy:
            kept.append("jump")
        j = host.jump
        where = f"[{j.address}]" if ":" in j.address else j.address
        jumps = _hops(config, path, f"{j.user + '@' if j.user else ''}{where}{':' + str(j.port) if j.port_given else ''}",
                      user)
    elif proxy and proxy.lower() != "none":
        applied.append(f"proxyjump {proxy}")
        jumps = _hops(config, path, proxy, user)
    notes = ("proxycommand ignored: fleetspec connects itself (use ProxyJump)",) if "proxycommand" in got else ()
    return Reach(Hop(host.address, address, port, user, keys), tuple(jumps), tuple(applied), tuple(kept),
                 path if config is not None else None, notes)

"""Host keys: checked against the inventory's known_hosts (a changed key always refused, an
unknown one only trusted under accept-new), and the client keys offered to the host."""

from __future__ import annotations

import base64
import os
import struct
import threading
from base64 import b64encode
from hashlib import sha256
from pathlib import Path

from fleetspec.errors import RemoteError
from fleetspec.model import known_hosts as known_hosts_file
from fleetspec.model.inventory import Host
from fleetspec.remote.ssh_lib import paramiko


class HostKeyError(RemoteError):
    """A host key that is unknown (and not to be trusted) or changed; never retried."""


def fingerprint(key: paramiko.PKey) -> str:
    return "SHA256:" + b64encode(sha256(key.asbytes()).digest()).decode().rstrip("=")


def _known_hosts_lines(path: Path) -> tuple[paramiko.HostKeys, list[known_hosts_file.Marked]]:
    """The file's plain keys (paramiko's HostKeys) and its @revoked / @cert-authority lines
    (model/known_hosts.py; paramiko cannot read those)."""
    keys = paramiko.HostKeys()
    marked: list[known_hosts_file.Marked] = []
    if path.is_file():
        try:
            plain, marked = known_hosts_file.split_marked(path.read_text(errors="replace"))
        except OSError as err:
            raise HostKeyError(f"cannot read known_hosts {path}: {err}") from None
        for n, line in enumerate(plain, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(text, n)
            except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError):
                continue                  # as paramiko's own load: a line it cannot read names no key
            if entry is not None:
                for h in entry.hostnames:
                    keys.add(h, entry.key.get_name(), entry.key)
    return keys, marked


def check_host_key(label: str, name: str, key: paramiko.PKey, known_hosts: Path | None, accept_new: bool) -> None:
    """Refuse a revoked key (`@revoked`) and a changed key always; an unknown one unless
    accept_new (then record it). A host known only through `@cert-authority` is refused saying
    so: fleetspec checks host keys, not host certificates."""
    if known_hosts is None:
        raise HostKeyError(f"{label}: no known_hosts file configured in the inventory; refusing {name}")
    keys, marked = _known_hosts_lines(known_hosts)
    for m in marked:
        if m.marker == "@revoked" and m.keytype == key.get_name() and m.key == key.get_base64():
            raise HostKeyError(f"{label}: host key of {name} ({key.get_name()} {fingerprint(key)}) is marked "
                               f"@revoked in {known_hosts} line {m.line}; refusing to connect")
    entry = keys.lookup(name)
    if entry:
        known = entry.get(key.get_name())
        if known is not None and known.asbytes() == key.asbytes():
            return
        if known is not None or len(entry):
            raise HostKeyError(
                f"{label}: host key for {name} CHANGED (now {key.get_name()} {fingerprint(key)}), "
                f"not what {known_hosts} records; refusing to connect")
    if not accept_new:
        ca = next((m for m in marked if m.marker == "@cert-authority" and known_hosts_file.host_matches(m.hosts, name)),
                  None)
        if ca is not None:
            raise HostKeyError(
                f"{label}: {name} is trusted in {known_hosts} only through @cert-authority (line {ca.line}); "
                f"fleetspec checks host keys, not host certificates: add the host's own key line "
                f"({_keyscan(name, key.get_name())}) or use accept-new")
        raise HostKeyError(
            f"{label}: unknown host key for {name} ({key.get_name()} {fingerprint(key)}) not in {known_hosts}; "
            f"use host_key_policy: accept-new or --accept-new-host-key to trust it")
    why = known_hosts_file.problem(known_hosts.resolve())
    if why:                         # checked at load too; the file may have changed since
        raise HostKeyError(f"{label}: refusing to record the key of {name}: {why}")
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _KH_LOCK:
        fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _keyscan(name: str, keytype: str) -> str:
    """The ssh-keyscan command line that prints `name`'s key (`[addr]:port` or a bare address)."""
    address, _, port = name[1:].partition("]:") if name.startswith("[") else (name, "", "")
    return f"ssh-keyscan -t {keytype}{' -p ' + port if port else ''} {address}"


_KH_LOCK = threading.Lock()


def _load_keys(host: Host, paths: tuple[Path, ...] = ()) -> list[paramiko.PKey]:
    """`paths` (the route's keys: the inventory's or ssh_config's IdentityFile), else the
    inventory's key; without one, the agent's keys then ~/.ssh/id_* (as ssh would). A key file
    with a passphrase is used as OpenSSH uses it: through the agent's key with the same public half."""
    chosen = paths or ((host.ssh_key,) if host.ssh_key is not None else ())
    if chosen:
        agent: list[paramiko.PKey] | None = None
        out = []
        for path in chosen:
            key = _load_key_file(host, Path(path))
            if key is None:                               # passphrase-protected: the agent's copy
                agent = _agent_keys() if agent is None else agent
                key = _agent_key_for(host, Path(path), agent)
            out.append(key)
        return out
    keys: list[paramiko.PKey] = _agent_keys()
    for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
        p = Path.home() / ".ssh" / name
        if p.is_file():
            try:
                keys.append(paramiko.PKey.from_path(p))
            except Exception:  # a default key that cannot be read (a passphrase) is skipped, as ssh does
                continue
    return keys


def _load_key_file(host: Host, path: Path) -> paramiko.PKey | None:
    """The key in `path`; None when it is passphrase-protected (paramiko raises TypeError then);
    any other failure is one line naming the file."""
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        return None
    except TypeError as err:
        if "password" in str(err).lower() or "encrypted" in str(err).lower():
            return None
        raise RemoteError(f"{host.name}: cannot load ssh key {path}: {err}") from None
    except Exception as err:  # a key file fleetspec cannot use is one line, never a traceback
        raise RemoteError(f"{host.name}: cannot load ssh key {path}: {err or type(err).__name__}") from None


def _agent_keys() -> list[paramiko.PKey]:
    try:
        return list(paramiko.Agent().get_keys())
    except Exception:  # no agent, or one that does not answer: no agent keys
        return []


def _agent_key_for(host: Host, path: Path, agent: list[paramiko.PKey]) -> paramiko.PKey:
    """The agent's key whose public half is `path`'s (read from `path.pub`, or from the key file
    itself: OpenSSH's format keeps the public key unencrypted)."""
    blob = _public_blob(path)
    for key in agent:
        if blob is not None and key.asbytes() == blob:
            return key
    if blob is None:
        why = f"its public half is unknown (no {path}.pub)"
    elif not os.environ.get("SSH_AUTH_SOCK"):
        why = "no ssh-agent is running ($SSH_AUTH_SOCK is unset)"
    else:
        why = "ssh-agent holds no matching key" if agent else "ssh-agent holds no keys"
    raise RemoteError(f"{host.name}: ssh key {path} has a passphrase and {why}: run `ssh-add {path}` "
                      f"(fleetspec never asks for a passphrase)")


_OPENSSH_MAGIC = b"openssh-key-v1\0"


def _public_blob(path: Path) -> bytes | None:
    """The public key of a private key file: `path.pub`'s, else the one an OpenSSH-format key
    file holds in the clear ("openssh-key-v1": cipher, kdf, kdf options, count, then the public key)."""
    try:
        pub = Path(f"{path}.pub").read_text().split()
        if len(pub) >= 2:
            return base64.b64decode(pub[1], validate=True)
    except (OSError, ValueError):
        pass
    try:
        text = path.read_text()
        body = "".join(ln for ln in text.splitlines() if ln and not ln.startswith("-----"))
        data = base64.b64decode(body, validate=True)
        if not data.startswith(_OPENSSH_MAGIC):
            return None
        at = len(_OPENSSH_MAGIC)
        for _ in range(3):                                  # ciphername, kdfname, kdfoptions
            (n,) = struct.unpack(">I", data[at:at + 4])
            at += 4 + n
        (count,) = struct.unpack(">I", data[at:at + 4])
        (n,) = struct.unpack(">I", data[at + 4:at + 8])
        return data[at + 8:at + 8 + n] if count >= 1 and n else None
    except (OSError, ValueError, struct.error):
        return None

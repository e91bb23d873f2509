"""`lab up`, `lab down`, `lab status`: the sequence over hosts, network and image, made idempotent
and safe to repeat after a crash (down finds leftovers by their fixed names, not only by state)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fleetspec.errors import UserError
from fleetspec.lab import cgroups, hosts, image, inventory, keys, network, podman_image, profiles, quadlet, ssh

DEFAULT_HOSTS = ("ct129", "ct200")
INOTIFY = Path("/proc/sys/fs/inotify/max_user_instances")
# A booted Debian 12 host holds 7 inotify instances (systemd 5, dbus 1, logind 1), all counted
# against root's limit on the machine (default 128): past ~17 hosts systemd in the next one cannot
# start sshd. Issue 17's 32-host rows need more.
INOTIFY_PER_HOST = 8


@dataclass
class UpResult:
    inventory: Path
    addresses: dict[str, str]
    started: list[str]
    reused: list[str]
    image_built: bool
    seconds: float


def require_root() -> None:
    if os.geteuid() != 0:
        raise UserError("the lab needs root: it creates network namespaces, overlay mounts, cgroups "
                        "and systemd-nspawn containers (run with sudo)")
    for tool in ("systemd-nspawn", "ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise UserError(f"the lab needs {tool!r} on PATH (apt-get install systemd-container "
                            "iproute2 openssh-client)")


@contextmanager
def _locked():
    hosts.RUN.mkdir(parents=True, exist_ok=True)
    with open(hosts.RUN / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def up(root: Path, names=DEFAULT_HOSTS, log=print, boot_timeout: float = 60.0) -> UpResult:
    require_root()
    t0 = time.monotonic()
    names = list(dict.fromkeys(names))
    chosen = {n: profiles.for_host(n) for n in names}
    with _locked():
        built = image.ensure(sorted({p.version for p in chosen.values()}), log=log)
        built = podman_image.ensure(sorted({p.version for p in chosen.values() if p.container}), log) or built
        if any(p.quadlet for p in chosen.values()):
            built = quadlet.ensure(log) or built
        client = keys.client_key(root)
        network.ensure_bridge()
        addresses, started, reused = {}, [], []
        for name in hosts.running(root):
            if name not in names:
                addresses[name] = address_of(name)  # this root's other hosts stay listed
        taken = {address_of(n) for n in hosts.running()} - set(addresses.values())
        for name in names:
            state = hosts.HostState.load(name)
            if hosts.is_running(state) and not state.owned_by(root):
                raise UserError(f"lab host {name} is running for another fleet root ({state.root}); pick other "
                                f"names (--hosts, FLEETSPEC_LAB_HOSTS) or stop it there with `fleetspec lab down`")
            if hosts.is_running(state) and state.profile == chosen[name].like:
                addresses[name] = state.address
                reused.append(name)
                continue
            if state is not None or hosts.host_dir(name).exists():
                hosts.stop(name)
            addresses[name] = profiles.address(name, set(addresses.values()) | taken | {"10.200.0.1"})
        keys.write_known_hosts(root, addresses)
        ensure_inotify(len(set(hosts.running()) | set(names)), log)
        for name in names:
            if name in reused:
                continue
            hk = keys.host_key(root, name)
            hosts.populate(name, chosen[name], root, client.with_suffix(".pub").read_bytes(), hk)
            hosts.boot(name, addresses[name], chosen[name], root)
            started.append(name)
        for name in names:
            wait_ready(root, name, addresses[name], boot_timeout)
        inv = inventory.write(root, addresses)
    return UpResult(inv, addresses, started, reused, built, time.monotonic() - t0)


def ensure_inotify(count: int, log=print) -> None:
    """Raise (never lower) the machine's inotify instance limit so `count` lab hosts can boot."""
    need = 128 + count * INOTIFY_PER_HOST
    try:
        have = int(INOTIFY.read_text())
        if have < need:
            INOTIFY.write_text(f"{need}\n")
            log(f"fs.inotify.max_user_instances {have} -> {need} ({count} lab hosts, ~7 instances each)")
    except (OSError, ValueError) as err:
        log(f"could not raise fs.inotify.max_user_instances to {need} ({err}); more than ~17 lab hosts may not boot")


def _still_running(name: str, looks: int = 5) -> bool:
    """Its process is there. One look can miss a booting host: /proc/<pid>/cmdline reads empty
    while the process is in execve (unshare -> sh -> systemd-nspawn), and a CI run saw a host that
    went on to boot fine declared stopped. Gone means gone at every look, 0.2 s apart."""
    for i in range(looks):
        if hosts.is_running(hosts.HostState.load(name)):
            return True
        if i + 1 < looks:
            time.sleep(0.2)
    return False


def wait_ready(root: Path, name: str, address: str, timeout: float) -> None:
    """Poll (with backoff) until ssh answers and systemd says the boot finished."""
    deadline = time.monotonic() + timeout
    delay, last = 0.1, ""
    while time.monotonic() < deadline:
        if not _still_running(name):
            raise UserError(f"lab host {name} stopped while booting; see {hosts.host_dir(name) / 'console.log'}")
        try:
            r = ssh.run(root, address, "systemctl is-system-running --wait", timeout=max(5, deadline - time.monotonic()))
            last = (r.stdout + r.stderr).decode(errors="replace").strip()
            if last in ("running", "degraded"):
                if last == "degraded":
                    failed = ssh.run(root, address, "systemctl --failed --no-legend --plain", timeout=10)
                    print(f"lab host {name}: systemd degraded: {failed.stdout.decode().strip()}")
                return
        except subprocess.TimeoutExpired:
            last = "ssh timed out"
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
    raise UserError(f"lab host {name} ({address}) not ready after {timeout:.0f} s (last: {last or 'no answer'})")


def down(root: Path | None = None, log=print, everything: bool = False, only=None) -> list[str]:
    """Stop the lab hosts that `root`'s `lab up` booted (every host when root is None or
    `everything`; of those, only the names in `only` when given), and, once no lab host is left
    running, the shared debris: leftover namespaces and cgroups of crashed runs and the bridge.
    Another checkout's hosts are never touched."""
    require_root()
    problems = []
    scope = None if everything else root
    with _locked():
        names = set(n for n in hosts.known() if (s := hosts.HostState.load(n)) is None or s.owned_by(scope))
        if only is not None:
            names &= set(only)
        elif scope is None:
            names.update(ns[len(network.NS_PREFIX):] for ns in network.lab_namespaces())
        for name in sorted(names):
            problems += hosts.stop(name)
            log(f"lab host {name} stopped")
        if not hosts.running():
            problems += _remove_shared_debris()
        if root is not None:
            left = {n: address_of(n) for n in hosts.running(root)}
            inventory.write(root, left) if left else inventory.remove(root)
    return problems


def _remove_shared_debris() -> list[str]:
    problems = []
    for ns in network.lab_namespaces():
        problems += hosts.stop(ns[len(network.NS_PREFIX):])
    for path in cgroups.leftovers():
        problems += cgroups.remove(sorted(p for p in path.iterdir() if p.is_dir())) if path.is_dir() else []
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as err:
            problems.append(f"{path}: {err}")
    network.remove_bridge()
    netns_dir = Path("/run/netns")
    if netns_dir.is_dir() and not any(netns_dir.iterdir()):
        subprocess.run(["umount", str(netns_dir)], capture_output=True)
        try:
            netns_dir.rmdir()
        except OSError:
            pass
    return problems


def status(root: Path | None = None) -> list[dict]:
    rows = []
    for name in hosts.known():
        state = hosts.HostState.load(name)
        running = hosts.is_running(state)
        row = {"host": name, "address": state.address if state else "?",
               "profile": state.profile if state else "?", "sglang": state.version if state else "?",
               "running": running, "ssh": None, "service": None}
        if running and state is not None and root is not None:
            try:
                r = ssh.run(root, state.address, "systemctl is-active sglang-qwen.service", timeout=5)
                row["ssh"] = r.returncode in (0, 3)
                row["service"] = r.stdout.decode().strip() or None
            except subprocess.TimeoutExpired:
                row["ssh"] = False
        rows.append(row)
    return rows


def address_of(name: str) -> str:
    state = hosts.HostState.load(name)
    if not hosts.is_running(state):
        raise UserError(f"lab host {name} is not running (fleetspec lab up --hosts {name})")
    return state.address

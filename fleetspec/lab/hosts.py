"""One lab host: an overlay root, a network namespace, a cgroup, and systemd-nspawn booting it.

The overlay is mounted inside a private mount namespace (`unshare -m`) by the very process that
then execs nspawn, so the machine's mount table never holds it and a crash cannot leak it. The
host's own writes land in its upper folder under /run/fleetspec-lab/hosts/<name>/, where they can
be read from outside.
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeGuard

from fleetspec.lab import cgroups, envs, image, network, podman_image, profiles, quadlet
from fleetspec.lab.engine import files as engine_files

RUN = Path(os.environ.get("FLEETSPEC_LAB_RUN", "/run/fleetspec-lab"))
# Users every lab host has besides root, each with the lab's client key (issue 12, "access as
# operators have it"): name -> (uid, sudoers rule or None).
LAB_USERS = {
    "ops": (1001, "ops ALL=(ALL:ALL) NOPASSWD: ALL"),       # a cloud image's admin user
    "nosudo": (1002, None),                                 # no sudo rule at all
    "pwsudo": (1003, "pwsudo ALL=(ALL:ALL) ALL"),           # sudo that asks for a password
}
HOST_CACHE_TAG = "cpython-311"      # Debian 12's python, every lab host's venv
# The lab's pace: half the stand-in's default step (0.01 s against 0.02 s) and a short model load.
# Its decode work takes ~5 ms a step here, so every modelled step still sleeps (the cost model, not
# the CPU, sets the figures) and each gate measurement takes half the time.
ENGINE_JSON = {"load_seconds": 0.5, "warmup_seconds": 0.25, "step_seconds": 0.01}


@dataclass
class HostState:
    name: str
    address: str
    profile: str
    version: str
    pid: int
    cgroups: list[str]
    started: float
    root: str = ""  # the fleet root whose `lab up` booted it ("" for states written before this field)

    def owned_by(self, root: Path | str | None) -> bool:
        return root is None or not self.root or self.root == str(Path(root).resolve())

    @staticmethod
    def load(name: str) -> "HostState | None":
        try:
            return HostState(**json.loads((host_dir(name) / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self) -> None:
        (host_dir(self.name) / "state.json").write_text(json.dumps(asdict(self), indent=1) + "\n")


def host_dir(name: str) -> Path:
    return RUN / "hosts" / name


def known() -> list[str]:
    folder = RUN / "hosts"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def running(root: Path | str | None = None) -> list[str]:
    """Running lab hosts, only those booted for `root` when it is given."""
    out = []
    for name in known():
        state = HostState.load(name)
        if is_running(state) and state.owned_by(root):
            out.append(name)
    return out


def is_running(state: HostState | None) -> TypeGuard[HostState]:
    if state is None:
        return False
    try:
        cmdline = Path(f"/proc/{state.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # Right after boot() the process may still be `unshare` or `sh` on its way to exec nspawn.
    return (Path(cmdline[0].decode(errors="replace")).name in ("systemd-nspawn", "unshare", "sh")
            and any(b"systemd-nspawn" in arg for arg in cmdline)
            and any(state.name.encode() == arg or f"/{state.name}/".encode() in arg for arg in cmdline))


def _mkdirs(upper: Path, rel: str, lowers: list[Path]) -> Path:
    """mkdir -p in the upper folder, copying each new folder's mode and owner from the lower layer
    (an upper folder's attributes win in the merged view: /root must stay 0700)."""
    path = upper
    for part in Path(rel).parts:
        path = path / part
        if path.exists():
            continue
        sub = path.relative_to(upper)
        src = next((lo / sub for lo in lowers if (lo / sub).is_dir()), None)
        path.mkdir()
        if src is not None:
            st = src.stat()
            os.chown(path, st.st_uid, st.st_gid)
            os.chmod(path, st.st_mode & 0o7777)
    return path


def _write(upper: Path, lowers: list[Path], dest: str, data: bytes, mode: int = 0o644) -> None:
    rel = dest.lstrip("/")
    _mkdirs(upper, str(Path(rel).parent), lowers)
    target = upper / rel
    target.write_bytes(data)
    os.chmod(target, mode)


def lowerdirs(profile: profiles.Profile) -> list[Path]:
    if profile.quadlet:
        return [quadlet.layer(), *podman_image.lowerdirs(profile.version)]
    return podman_image.lowerdirs(profile.version) if profile.container else image.lowerdirs(profile.version)


def populate(name: str, profile: profiles.Profile, root: Path, client_pub: bytes, host_key: Path) -> None:
    """Everything host-specific, laid into the upper folder before the first boot."""
    upper = host_dir(name) / "upper"
    upper.mkdir(parents=True, exist_ok=True)
    os.chmod(upper, 0o755)  # the upper root's mode becomes the merged root's
    lowers = lowerdirs(profile)
    _write(upper, lowers, "/etc/hostname", f"{name}\n".encode())
    _write(upper, lowers, "/etc/hosts", f"127.0.0.1 localhost\n127.0.1.1 {name}\n::1 localhost\n".encode())
    _write(upper, lowers, "/root/.ssh/authorized_keys", client_pub, 0o600)
    _write(upper, lowers, "/etc/ssh/ssh_host_ed25519_key", host_key.read_bytes(), 0o600)
    _write(upper, lowers, "/etc/ssh/ssh_host_ed25519_key.pub", host_key.with_suffix(".pub").read_bytes())
    _write(upper, lowers, "/etc/ssh/sshd_config.d/fleetspec-lab-hostkey.conf",
           b"HostKey /etc/ssh/ssh_host_ed25519_key\n")
    for dest, data in profiles.files(profile).items():
        _write(upper, lowers, dest, data)
    if not profile.quadlet:     # Quadlet's generator links its unit from its [Install] at every boot
        wants = _mkdirs(upper, "etc/systemd/system/multi-user.target.wants", lowers)
        (wants / profiles.SERVICE).symlink_to(f"/etc/systemd/system/{profiles.SERVICE}")
    _write(upper, lowers, "/etc/fleetspec-lab/engine.json", (json.dumps(ENGINE_JSON, indent=1) + "\n").encode())
    _write(upper, lowers, "/etc/fleetspec-lab/host.json", (json.dumps(
        {"name": name, "profile": profile.like, "sglang_version": profile.version,
         "venv": profile.venv}, indent=1) + "\n").encode())
    site = image.site_packages(profile.version)
    engine = engine_files()
    for rel, data in engine.items():
        _write(upper, lowers, f"{site}/{rel}", data)
    stub = {f"torchvision/{name}": text.encode() for name, text in envs.TORCHVISION_STUB.items()
            if any((lo / site.lstrip("/") / "torchvision" / name).exists() for lo in lowers)}
    for rel, data in byte_code({**engine, **stub}, site).items():
        _write(upper, lowers, f"{site}/{rel}", data)
    add_users(upper, lowers, client_pub)


def byte_code(sources: dict[str, bytes], site: str) -> dict[str, bytes]:
    """Byte code for the lab's own modules (its engine, the torchvision stub), as pip compiles what
    it installs, so the engine's first start writes nothing into site-packages (which a smoke
    verdict's check would count as a change of the install). Checked-hash pycs: valid while the
    source hashes the same, whatever its mtime. None when this python's tag is not the hosts'."""
    if sys.implementation.cache_tag != HOST_CACHE_TAG:
        return {}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rel, data in sources.items():
            if not rel.endswith(".py"):
                continue
            src, pyc = Path(tmp) / "m.py", Path(tmp) / "m.pyc"
            src.write_bytes(data)
            py_compile.compile(str(src), cfile=str(pyc), dfile=f"{site}/{rel}", doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            out[importlib.util.cache_from_source(rel)] = pyc.read_bytes()
    return out


def _lower_bytes(lowers: list[Path], rel: str) -> tuple[bytes, os.stat_result]:
    path = next(lo / rel for lo in lowers if (lo / rel).exists())
    return path.read_bytes(), path.stat()


def add_users(upper: Path, lowers: list[Path], client_pub: bytes) -> None:
    """LAB_USERS in passwd/shadow/group (owners and modes kept), their keys, and a sudoers file;
    done at `lab up` so the image's layers stay as they are. Passwords are `*`: none works, and
    sshd still takes the key (`!` would lock the account)."""
    lines = {"etc/passwd": "{u}:x:{i}:{i}::/home/{u}:/bin/bash", "etc/shadow": "{u}:*:20000:0:99999:7:::",
             "etc/group": "{u}:x:{i}:"}
    for rel, line in lines.items():
        data, st = _lower_bytes(lowers, rel)
        names = {ln.split(b":")[0] for ln in data.splitlines()}
        extra = "".join(line.format(u=u, i=uid) + "\n" for u, (uid, _) in LAB_USERS.items()
                        if u.encode() not in names)
        _write(upper, lowers, "/" + rel, data + extra.encode(), st.st_mode & 0o7777)
        os.chown(upper / rel, st.st_uid, st.st_gid)
    for user, (uid, _) in LAB_USERS.items():
        _write(upper, lowers, f"/home/{user}/.ssh/authorized_keys", client_pub, 0o600)
        for rel, mode in (("", 0o700), ("/.ssh", 0o700), ("/.ssh/authorized_keys", 0o600)):
            os.chown(upper / f"home/{user}{rel}", uid, uid)
            os.chmod(upper / f"home/{user}{rel}", mode)
    rules = "".join(f"{rule}\n" for _, rule in LAB_USERS.values() if rule)
    _write(upper, lowers, "/etc/sudoers.d/fleetspec-lab", rules.encode(), 0o440)


def boot(name: str, address: str, profile: profiles.Profile, root: Path | str = "") -> HostState:
    hd = host_dir(name)
    for sub in ("work", "merged"):
        (hd / sub).mkdir(parents=True, exist_ok=True)
    network.add_host(name, address)
    lower = ":".join(str(p) for p in lowerdirs(profile))
    opts = f"lowerdir={lower},upperdir={hd / 'upper'},workdir={hd / 'work'}"
    nspawn = ["systemd-nspawn", "-q", "-D", str(hd / "merged"), "-M", name, "--register=no",
              "--keep-unit", "--resolv-conf=off", "--timezone=off", "--link-journal=no",
              f"--network-namespace-path=/run/netns/{network.netns(name)}", "-b"]
    if profile.container:
        # podman's store on the machine's disk (overlay cannot nest on the host's overlay root), the
        # lab's image store read-only (podman_image.STORAGE_CONF)
        (hd / "containers").mkdir(exist_ok=True)
        nspawn[-1:-1] = [f"--bind={hd / 'containers'}:/var/lib/containers",
                         f"--bind-ro={podman_image.image_layer(profile.version)}:{podman_image.IMAGE_STORE}"]
    script = (f"mount -t overlay overlay -o {shlex.quote(opts)} {shlex.quote(str(hd / 'merged'))} && "
              f"exec {shlex.join(nspawn)}")
    paths = cgroups.host_paths(name)
    console = open(hd / "console.log", "ab")
    try:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=lambda: cgroups.enter(paths), close_fds=True)
    finally:
        console.close()
    state = HostState(name, address, profile.like, profile.version, proc.pid,
                      [str(p) for p in paths], time.time(), str(Path(root).resolve()) if root else "")
    state.save()
    return state


def _reap(state: HostState | None) -> None:
    """When this process started the host (tests: up and down in one process), collect it."""
    if state is None:
        return
    try:
        os.waitpid(state.pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(name: str, timeout: float = 20.0) -> list[str]:
    """Power the host off and remove everything it had; returns what could not be removed."""
    state = HostState.load(name)
    paths = [Path(p) for p in state.cgroups] if state else cgroups.host_paths(name)
    if is_running(state):
        os.kill(state.pid, signal.SIGTERM)  # nspawn: clean poweroff of the container
        deadline = time.monotonic() + timeout
        delay = 0.05
        while is_running(state) and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
    # Whatever is still in the host's cgroups was started for this host: end it by pid.
    for _ in range(3):
        left = cgroups.pids(paths)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    _reap(state)
    delay, deadline = 0.05, time.monotonic() + 5
    while (problems := cgroups.remove(paths)) and time.monotonic() < deadline:
        time.sleep(delay)  # an exited task can linger in cgroup.procs until its parent reaps it
        delay = min(delay * 2, 0.5)
        _reap(state)
    network.remove_host(name)
    shutil.rmtree(Path("/run/systemd/nspawn/propagate") / name, ignore_errors=True)
    shutil.rmtree(host_dir(name), ignore_errors=True)
    return problems

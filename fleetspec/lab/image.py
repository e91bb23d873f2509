"""The lab's cached image: a base Debian rootfs plus one layer per sglang environment.

Hosts boot from an overlay of read-only layers (`<env layer>:<base>`) so a host only sees the
sglang install its profile names, and nothing is copied per host. Each folder's name carries the
hash of the recipe that made it, so a changed recipe builds a new folder instead of reusing a
stale one. Builds run in a private mount namespace (`unshare -m`), so a crash leaves no mount.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

from fleetspec.errors import UserError
from fleetspec.lab import envs

DEBOOTSTRAP = envs.CACHE / "debootstrap" / "rootfs"
DEBOOTSTRAP_CMD = [
    "debootstrap", "--variant=minbase",
    "--include=systemd,systemd-sysv,dbus,openssh-server,iproute2,procps,python3,python3-venv,curl",
    "bookworm",
]
# Where each version's venv lives on a host (ct129's operators use /root/ml-env).
VENV = {"0.5.13.post1": "/root/ml-env", "0.5.23": "/opt/sglang/venv"}

# Bump when what _finish_base does changes: it is part of the base image's hash.
BASE_RECIPE: dict[str, Any] = {
    "v": 3,
    "debootstrap": DEBOOTSTRAP_CMD,
    "sshd": "PermitRootLogin prohibit-password; PasswordAuthentication no; UseDNS no",
    "masked": ["systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer",
               "e2scrub_all.timer", "fstrim.timer", "systemd-networkd-wait-online.service",
               "console-getty.service", "getty@tty1.service"],
}
SSHD_CONF = """\
# fleetspec lab: keys only, no DNS lookups (they stall without a resolver)
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 100:30:200
MaxSessions 64
"""


# Debian packages a host needs beyond debootstrap's, in a small layer of their own between the
# base and the sglang layers (so adding one rebuilds neither). The debs come from this machine's apt
# (Debian 12, as the image) once, into DEBS; builds after that are offline.
PACKAGES_RECIPE: dict[str, Any] = {"v": 2, "packages": ["sudo"]}
DEBS = envs.CACHE / "debs"


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def base_hash() -> str:
    return _digest(BASE_RECIPE)


def env_hash(version: str) -> str:
    # The wheels this version installs, not the whole cache: downloading another version's (or
    # another recipe's) wheels must not rebuild this layer.
    wheels = sorted(w.name for w in map(envs.cached_wheel, envs.requirements(version)) if w is not None)
    return _digest({"base": base_hash(), "version": version, "venv": VENV[version],
                    "requirements": envs.requirements(version), "wheels": wheels, "v": 1})


def base_dir() -> Path:
    return envs.CACHE / f"image-{base_hash()}" / "rootfs"


def env_layer(version: str) -> Path:
    return envs.CACHE / "layers" / f"sglang-{version}-{env_hash(version)}"


def packages_layer() -> Path:
    return envs.CACHE / "layers" / f"debs-{_digest({'base': base_hash(), **PACKAGES_RECIPE})}"


def lowerdirs(version: str) -> list[Path]:
    """Overlay lower layers for a host running `version`, topmost first."""
    return [env_layer(version), packages_layer(), base_dir()]


def marker(folder: Path) -> Path:
    """Completion marker beside (not inside) a layer, so hosts never see it."""
    return folder.with_name(folder.name + ".complete")


def ensure(versions, log=print) -> bool:
    """Build whatever is missing; return True if anything was built (a cold start)."""
    built = ensure_rootfs(log)
    built = ensure_base(log) or built
    built = ensure_packages(log) or built
    for version in versions:
        built = ensure_layer(version, log) or built
    return built


def ensure_rootfs(log=print) -> bool:
    if DEBOOTSTRAP.joinpath("usr/bin/python3").exists():
        return False
    log(f"debootstrap into {DEBOOTSTRAP} (~90 s, needs the Debian mirror)")
    DEBOOTSTRAP.parent.mkdir(parents=True, exist_ok=True)
    partial = DEBOOTSTRAP.with_name("rootfs.partial")
    if partial.exists():
        shutil.rmtree(partial)
    done = subprocess.run([*DEBOOTSTRAP_CMD, str(partial)], capture_output=True, text=True)
    if done.returncode != 0:
        last = next((ln for ln in reversed((done.stdout + done.stderr).splitlines()) if ln.strip()), "no output")
        raise UserError(f"debootstrap of Debian bookworm into {partial} failed (exit {done.returncode}; "
                        f"it needs the Debian mirror): {last.strip()}")
    if DEBOOTSTRAP.exists():
        shutil.rmtree(DEBOOTSTRAP)
    partial.rename(DEBOOTSTRAP)
    return True


def build_once(folder: Path, said: str, build: Callable[[], object], log=print) -> bool:
    """`build()` (after logging `said`) unless `folder`'s marker says it was built: every layer
    and image is built once. True when it built now."""
    if marker(folder).exists():
        return False
    log(said)
    build()
    return True


def ensure_base(log=print) -> bool:
    return build_once(base_dir(), f"building base image {base_dir()}", _build_base, log)


def ensure_packages(log=print) -> bool:
    return build_once(packages_layer(),
                      f"building package layer {packages_layer()} ({', '.join(PACKAGES_RECIPE['packages'])})",
                      lambda: _build_packages(fetch_debs()), log)


def fetch_debs(packages=None) -> list[Path]:
    """The recipe's .debs under DEBS, fetched with this machine's `apt-get download` when missing."""
    DEBS.mkdir(parents=True, exist_ok=True)
    found = []
    for name in packages or PACKAGES_RECIPE["packages"]:
        have = sorted(DEBS.glob(f"{name}_*.deb"))
        if not have:
            done = subprocess.run(["apt-get", "download", "-q", name], cwd=DEBS, capture_output=True,
                                  text=True, check=False)
            have = sorted(DEBS.glob(f"{name}_*.deb"))
            if done.returncode != 0 or not have:
                last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
                raise UserError(f"apt-get download {name} into {DEBS} failed (exit {done.returncode}; it needs "
                                f"apt's lists: apt-get update): {last}")
        found.append(have[-1])
    return found


def _build_packages(debs: list[Path], final: Path | None = None, lowers: list[Path] | None = None,
                    files: dict[str, str] | None = None) -> None:
    """dpkg -i the debs in a chroot of the base (or of `lowers`), then write `files` (absolute path
    -> text); the overlay's upper folder is the layer."""
    final = final or packages_layer()
    partial, scratch = final.with_name(final.name + ".partial"), final.with_name(final.name + ".scratch")
    for folder in (partial, scratch):
        if folder.exists():
            shutil.rmtree(folder)
    partial.mkdir(parents=True)
    (scratch / "work").mkdir(parents=True)
    (scratch / "merged").mkdir()
    q, merged = shlex.quote, scratch / "merged"
    # a root-only folder of the image's own, never its world-writable /tmp
    inbox = "/root/fleetspec-debs"
    names = [f"{inbox}/{d.name}" for d in debs]
    script = _chroot_script(partial, scratch / "work", merged,
                            [f"mkdir -m 0700 -- {q(str(merged) + inbox)}",
                             *(f"cp -- {q(str(d))} {q(str(merged) + n)}" for d, n in zip(debs, names, strict=True))],
                            [f"/usr/bin/dpkg -i {' '.join(map(q, names))}"],
                            [f"rm -rf -- {q(str(merged) + inbox)}",
                             *(f"mkdir -p -- {q(str(merged) + str(Path(dest).parent))} && printf %s {q(text)} > "
                               f"{q(str(merged) + dest)}" for dest, text in (files or {}).items())],
                            lowers=lowers)
    try:
        subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       check=True, env=_clean_env(), capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        last = (err.stderr.strip() or err.stdout.strip() or "no output").splitlines()[-1]
        raise UserError(f"installing {', '.join(d.name for d in debs)} into {partial} failed "
                        f"(exit {err.returncode}): {last}") from None
    shutil.rmtree(scratch)
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    marker(final).write_text(json.dumps([d.name for d in debs]) + "\n")


def ensure_layer(version: str, log=print) -> bool:
    def build() -> None:
        envs.download_wheels((version,))
        envs.require_cached(version)
        _build_env(version)

    return build_once(env_layer(version),
                      f"building sglang {version} layer {env_layer(version)} (minutes; offline from {envs.WHEELS})",
                      build, log)


def _build_base() -> None:
    final = base_dir()
    partial = final.with_name("rootfs.partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "--reflink=auto", str(DEBOOTSTRAP), str(partial)], check=True)
    _finish_base(partial)
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    marker(final).write_text(json.dumps(BASE_RECIPE) + "\n")


def _finish_base(root: Path) -> None:
    """Settings every host shares: no DNS, keys-only sshd, per-host host keys, quiet boot."""
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("")
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # each host gets its own, written at `lab up`
    (root / "etc/ssh/sshd_config.d/fleetspec-lab.conf").write_text(SSHD_CONF)
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    for unit in BASE_RECIPE["masked"]:
        link = root / "etc/systemd/system" / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    (root / "etc/machine-id").write_text("")
    for folder in ("var/lib/fleetspec", "etc/fleetspec-lab"):
        (root / folder).mkdir(parents=True, exist_ok=True)


def _build_env(version: str) -> None:
    """Install one version's venv with the image's own python, in a chroot, offline."""
    final = env_layer(version)
    partial = final.with_name(final.name + ".partial")
    scratch = final.with_name(final.name + ".scratch")
    for folder in (partial, scratch):
        if folder.exists():
            shutil.rmtree(folder)
    venv = VENV[version]
    target = partial / venv.lstrip("/")
    target.mkdir(parents=True)
    for sub in ("upper", "work", "merged"):
        (scratch / sub).mkdir(parents=True)
    merged = scratch / "merged"
    q = shlex.quote
    pip = [f"{venv}/bin/python", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--disable-pip-version-check", "--find-links", "/mnt/wheels", *envs.requirements(version)]
    script = _chroot_script(scratch / "upper", scratch / "work", merged, [
        f"mkdir -p {q(str(merged / venv.lstrip('/')))} {q(str(merged / 'mnt/wheels'))}",
        f"mount --bind {q(str(target))} {q(str(merged / venv.lstrip('/')))}",
        f"mount --bind -o ro {q(str(envs.WHEELS))} {q(str(merged / 'mnt/wheels'))}",
    ], [f"/usr/bin/python3 -m venv {q(venv)}", shlex.join(pip)])
    try:
        subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       check=True, env=_clean_env())
    except subprocess.CalledProcessError as err:
        raise UserError(f"building the sglang {version} layer failed (exit {err.returncode}); see output above") from err
    envs.torchvision_stub(target)
    shutil.rmtree(scratch)
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    marker(final).write_text(version + "\n")


def _chroot_script(upper: Path, work: Path, merged: Path, before: list[str], commands: list[str],
                   after: tuple[str, ...] | list[str] = (), lowers: list[Path] | None = None) -> str:
    """A `set -e` script (run under `unshare --mount`) that mounts the base image with `upper` as
    its overlay's upper folder at `merged`, runs `before` on the host side, then `commands` inside
    the chroot (with /proc and /dev), then `after`."""
    q = shlex.quote
    lower = ":".join(str(p) for p in (lowers or [base_dir()]))
    overlay = q(f"lowerdir={lower},upperdir={upper},workdir={work}")
    return "\n".join([
        "set -e",
        f"mount -t overlay overlay -o {overlay} {q(str(merged))}",
        *before,
        f"mount -t proc proc {q(str(merged / 'proc'))}",
        f"mount --rbind /dev {q(str(merged / 'dev'))}",
        *(f"chroot {q(str(merged))} {c}" for c in commands),
        *after,
    ])


def _clean_env() -> dict:
    """The machine's pip settings (find-links, extra indexes) mean nothing inside the chroot."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE="/dev/null", PIP_DISABLE_PIP_VERSION_CHECK="1", HOME="/root")
    return env


def site_packages(version: str) -> str:
    """The venv's site-packages path as the host sees it (python 3.11 in Debian 12)."""
    return f"{VENV[version]}/lib/python3.11/site-packages"

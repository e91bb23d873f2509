"""The container hosts' part of the lab's image: Debian's podman in a layer of its own, and the
engine's image imported (no registry) into a podman store that every container host mounts
read-only. Built only when a container host is asked for (docs/guide/containers.md)."""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from fleetspec.errors import UserError
from fleetspec.lab import envs
from fleetspec.lab.image import (
    _build_packages,
    _chroot_script,
    _clean_env,
    _digest,
    base_dir,
    build_once,
    env_layer,
    fetch_debs,
    marker,
    packages_layer,
    site_packages,
)
from fleetspec.lab.image import lowerdirs as bare_lowerdirs

# Podman for the container hosts (a unit whose ExecStart is `podman run …`), in a layer only
# those hosts have. The list is what `apt-get install --no-install-recommends podman crun` adds to
# the base and package layers (Debian 12: podman 4.3.1, crun 1.8.1). Inside an nspawn host: its
# root is overlayfs (the kernel's overlay cannot have its upper folder there) and there is no
# /dev/fuse, so podman's store is a folder of the machine's disk bind-mounted at
# /var/lib/containers, where the overlay driver works (vfs on the host's root works too, but
# copies the 2.8 GB image for every container: 14-80 s per start here); the image itself is a
# read-only store shared by every host (IMAGE_STORE). The host's cgroups are read-only, so the
# container gets none (it stays in the unit's cgroup); nspawn's seccomp filter refuses keyctl
# to the host's services, so no session keyring.
CONTAINERS_CONF = """\
# fleetspec lab: podman inside a systemd-nspawn host
[containers]
cgroups = "disabled"
keyring = false

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "crun"
"""
IMAGE_STORE = "/var/lib/fleetspec-images"
STORAGE_CONF = f"""\
# fleetspec lab: /var/lib/containers is a bind mount of the machine's disk (the host's root is
# overlayfs); the lab's images are in a read-only store shared by all hosts
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"

[storage.options]
additionalimagestores = ["{IMAGE_STORE}"]
"""
PODMAN_RECIPE: dict[str, Any] = {
    "v": 1,
    "packages": ["netbase", "libglib2.0-0", "conmon", "libip6tc2", "libnfnetlink0", "libnetfilter-conntrack3",
                 "libnftnl11", "iptables", "containernetworking-plugins", "libyajl2", "crun", "libassuan0",
                 "gpgconf", "libksba8", "libnpth0", "dirmngr", "gnupg-l10n", "gnupg-utils", "gpg",
                 "pinentry-curses", "gpg-agent", "gpg-wks-client", "gpg-wks-server", "gpgsm", "gnupg",
                 "golang-github-containers-image", "golang-github-containers-common", "libgpgme11",
                 "libsubid4", "podman"],
    "files": {"/etc/containers/containers.conf": CONTAINERS_CONF, "/etc/containers/storage.conf": STORAGE_CONF},
}
# The engine's image, imported from a tarball of the host's own root (Debian's python and the
# version's venv with the engine stand-in): no registry. Its name says the version.
IMAGE_DIRS = ("bin", "sbin", "lib", "lib64", "usr", "etc", "opt", "root/ml-env")
CONTAINER_VERSIONS = ("0.5.23",)     # the versions a container host runs (profiles: pd<N>)
IMAGE_RECIPE = {"v": 2, "dirs": IMAGE_DIRS, "driver": "overlay"}


def image_name(version: str) -> str:
    return f"localhost/sglang-lab:{version}"


def podman_layer() -> Path:
    return envs.CACHE / "layers" / f"podman-{_digest({'below': packages_layer().name, **PODMAN_RECIPE})}"


def image_layer(version: str) -> Path:
    """A podman store (overlay driver) holding `image_name(version)`, bind-mounted read-only at
    IMAGE_STORE on container hosts: it changes with the venv and the engine."""
    from fleetspec.lab.engine import files as engine_files

    engine = hashlib.sha256(json.dumps({k: v.hex() for k, v in engine_files().items()}, sort_keys=True).encode())
    return envs.CACHE / "layers" / (f"image-{version}-" + _digest(
        {"podman": podman_layer().name, "env": env_layer(version).name, "engine": engine.hexdigest(), **IMAGE_RECIPE}))


def lowerdirs(version: str) -> list[Path]:
    """A container host's lower layers: a bare host's, under the podman layer."""
    return [podman_layer(), *bare_lowerdirs(version)]


def ensure(versions, log=print) -> bool:
    """The podman layer and each version's image store, when missing (the bare layers first:
    image.ensure)."""
    if not versions:
        return False
    built = ensure_podman(log)
    for version in versions:
        built = ensure_image(version, log) or built
    return built


def ensure_podman(log=print) -> bool:
    return build_once(podman_layer(), f"building podman layer {podman_layer()}",
                      lambda: _build_packages(fetch_debs(PODMAN_RECIPE["packages"]), podman_layer(),
                                              [packages_layer(), base_dir()], PODMAN_RECIPE["files"]), log)


def ensure_image(version: str, log=print) -> bool:
    return build_once(image_layer(version), f"importing {image_name(version)} into {image_layer(version)}",
                      lambda: _build_image(version), log)


def _build_image(version: str) -> None:
    """`podman import` of a tarball of the merged root (with the engine stand-in in the venv), run
    in a chroot of the podman host's layers into a store on the machine's disk (the layer)."""
    from fleetspec.lab.engine import files as engine_files

    final = image_layer(version)
    partial, scratch = final.with_name(final.name + ".partial"), final.with_name(final.name + ".scratch")
    for folder in (partial, scratch):
        if folder.exists():
            shutil.rmtree(folder)
    partial.mkdir(parents=True)
    for sub in ("upper", "work", "merged", "tmp"):
        (scratch / sub).mkdir(parents=True)
    q, merged = shlex.quote, scratch / "merged"
    site = site_packages(version)
    # the engine goes into the image's venv (a scratch upper folder: hosts get their own copy)
    staged = {f"{merged}{site}/{rel}": data for rel, data in engine_files().items()}
    dirs = [d for d in IMAGE_DIRS if any((lo / d).exists() or (lo / d).is_symlink()
                                          for lo in (env_layer(version), packages_layer(), base_dir()))]
    tar = f"tar -c -C {q(str(merged))} {' '.join(dirs)}"
    # the hosts' storage.conf names this store as an extra one: not while it is being written
    (scratch / "tmp" / "storage.conf").write_text(f'[storage]\ndriver = "overlay"\nrunroot = "/run/fleetspec-import"\n'
                                                 f'graphroot = "{IMAGE_STORE}"\n')
    # podman's scratch inside the chroot: a root-only folder bound to this build's own scratch,
    # never a world-writable /tmp or /var/tmp
    importer = (f"chroot {q(str(merged))} env TMPDIR=/var/lib/fleetspec-import "
                "CONTAINERS_STORAGE_CONF=/var/lib/fleetspec-import/storage.conf podman --storage-driver overlay "
                f"--root {IMAGE_STORE} --runroot /run/fleetspec-import import "
                f"--message 'fleetspec lab: sglang {version} with the engine stand-in' - {q(image_name(version))}")
    script = _chroot_script(scratch / "upper", scratch / "work", merged, [
        f"mkdir -p {q(str(merged / 'var/lib/fleetspec-import'))} {q(str(merged) + IMAGE_STORE)}",
        f"mount --bind {q(str(scratch / 'tmp'))} {q(str(merged / 'var/lib/fleetspec-import'))}",
        f"mount --bind {q(str(partial))} {q(str(merged) + IMAGE_STORE)}",
        *(f"mkdir -p {q(str(Path(dest).parent))} && base64 -d > {q(dest)} <<'EOF'\n"
          f"{base64.b64encode(data).decode()}\nEOF" for dest, data in staged.items()),
    ], [], [
        f"mount -t tmpfs tmpfs {q(str(merged / 'run'))}",
        f"mount --rbind /sys {q(str(merged / 'sys'))}",
        f"{tar} | {importer}",
    ], lowers=[podman_layer(), env_layer(version), packages_layer(), base_dir()])
    try:
        subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       check=True, env=_clean_env(), capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        last = (err.stderr.strip() or err.stdout.strip() or "no output").splitlines()[-1]
        raise UserError(f"importing {image_name(version)} into {partial} failed (exit {err.returncode}): {last}") from None
    shutil.rmtree(scratch)
    shutil.rmtree(partial / "overlay-containers", ignore_errors=True)
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    marker(final).write_text(image_name(version) + "\n")

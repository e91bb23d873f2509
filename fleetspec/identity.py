"""This controller's identity: a random id made once and kept in its state folder, and the
machine and boot it runs in.

Hostnames repeat (cloned VMs, CI runners all called `runner`), so a lock holder is matched to
"us" by this id, never by the hostname: a pid is only meaningful on the controller that wrote it.
The id file can be copied (a cloned VM, machines sharing $HOME), so a pid is only judged where
`machine_boot()` is the one the holder recorded too: the same machine-id and the same boot.
`$FLEETSPEC_CONTROLLER_ID` overrides the id (tests run two controllers from one machine).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from pathlib import Path

from fleetspec.errors import UserError

ENV = "FLEETSPEC_CONTROLLER_ID"
_VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{7,63}$")


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fleetspec"


def controller_id() -> str:
    """The id, made on first use (0600 file in a 0700 folder; two first runs at once agree)."""
    override = os.environ.get(ENV)
    if override:
        if not _VALID.match(override):
            raise UserError(f"${ENV}={override!r}: expected 8-64 letters, digits, '-' or '_'")
        return override
    path = state_dir() / "controller-id"
    found = _read(path)
    if found:
        return found
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".controller-id.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (secrets.token_hex(16) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if path.exists():                  # there but unreadable as an id: replaced, not guessed
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)         # never overwrites an id another process just made
            except FileExistsError:
                pass
    finally:
        tmp.unlink(missing_ok=True)
    found = _read(path)
    if not found:
        raise UserError(f"{path}: could not record this controller's id")
    return found


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None
    except OSError as err:
        raise UserError(f"{path}: cannot read this controller's id: {err.strerror}") from None
    return text if _VALID.match(text) else None


def machine_boot() -> str:
    """This machine and this boot, hashed ("" where they cannot be read: then no pid is ever
    judged). A pid names a process only on the machine, and in the boot, that made it: a clone
    has another boot id (and usually another machine-id), a reboot another boot id."""
    def first(*paths: str) -> str:
        for path in paths:
            try:
                text = Path(path).read_text().strip()
            except OSError:
                continue
            if text:
                return text
        return ""

    machine = first("/etc/machine-id", "/var/lib/dbus/machine-id")
    boot = first("/proc/sys/kernel/random/boot_id")
    return hashlib.sha256(f"{machine}\n{boot}".encode()).hexdigest()[:16] if boot else ""

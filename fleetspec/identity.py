"""This controller's identity: a random id made once and kept in its state folder.

Hostnames repeat (cloned VMs, CI runners all called `runner`), so a lock holder is matched to
"us" by this id, never by the hostname: a pid is only meaningful on the controller that wrote it.
`$FLEETSPEC_CONTROLLER_ID` overrides it (tests run two controllers from one machine).
"""

from __future__ import annotations

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

"""A deploy lock's holder as its record names it (remote/lock.py holds and releases the lock):
who it is, where its pid lives, and whether its session is still alive on the host.

A pid is judged only on the controller, machine and boot that recorded it (`Holder.ours`); a
holder is ended by its own controller only when that pid is gone and its heartbeat file has
stopped growing on the host (`ended_here`): a copied controller id never ends a live session.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass

from fleetspec.identity import controller_id, machine_boot
from fleetspec.model import hostjson
from fleetspec.remote import files
from fleetspec.remote.api import TransportLike

q = shlex.quote


def heartbeat_s() -> float:
    return float(os.environ.get("FLEETSPEC_LOCK_HEARTBEAT_S", "2"))


def stale_after_s() -> float:
    """A session whose heartbeat is older than this is no longer alive (10 heartbeats missed)."""
    return float(os.environ.get("FLEETSPEC_LOCK_STALE_S", "30"))


@dataclass(frozen=True)
class Holder:
    who: str
    machine: str
    pid: int
    since: float
    release: str
    remote_pid: int | None = None
    controller: str = ""            # fleetspec.identity.controller_id() of the holder's controller
    token: str = ""                 # this holding's random id; names its record and heartbeat files
    boot: str = ""                  # fleetspec.identity.machine_boot() where `pid` lives ("": unknown)

    def describe(self) -> str:
        age = time.time() - self.since
        return (f"{self.who} (pid {self.pid} on {self.machine}, controller {self.controller[:8] or 'unknown'}, "
                f"release {self.release}, for {age:.0f}s)")

    def ours(self) -> bool:
        """Written by this controller (same id) on this machine in this boot, so its pid means
        something here: a copied id (a cloned VM, a shared $HOME) on another machine does not."""
        return bool(self.controller) and self.controller == controller_id() and bool(self.boot) \
            and self.boot == machine_boot()

    def dead_here(self) -> bool:
        """True when the holder is this controller's and its process is gone: a stale lock whose
        SSH session outlived it (a link cut leaves sshd holding it until TCP gives up). A holder
        from another controller is never "dead here", whatever its hostname."""
        return self.ours() and self.remote_pid is not None and not self.alive_here()

    def alive_here(self) -> bool:
        """True when the holder is a live process of this controller (then it is never forced)."""
        if not self.ours():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def holder_path(lock: str) -> str:
    return lock + ".holder"


def holders_dir(lock: str) -> str:
    return lock + ".holders"


def record_path(lock: str, token: str) -> str:
    return f"{holders_dir(lock)}/{token}.json"


def heartbeat_path(lock: str, token: str) -> str:
    return f"{holders_dir(lock)}/{token}.hb"


def read_holder(t: TransportLike, lock: str) -> Holder | None:
    text = t.run_script(files.read_optional(holder_path(lock), ""), timeout=30, check=True).stdout
    try:
        return Holder(**hostjson.loads_object(text, "the holder record")) if text else None
    except (ValueError, TypeError):
        return None


def heartbeat_age(t: TransportLike, lock: str, holder: Holder) -> float | None:
    """Seconds since the holder's session last showed life on the host (host clock both ends);
    None when it keeps no heartbeat (an older fleetspec, or a hand-made record)."""
    if not holder.token or not holder.token.isalnum():
        return None
    hb = q(heartbeat_path(lock, holder.token))
    out = t.run_script(f"[ -e {hb} ] && echo $(( $(date +%s) - $(stat -c %Y {hb}) ))", timeout=30, check=False).stdout
    try:
        return max(0.0, float(out.strip()))
    except ValueError:
        return None


def session_beating(t: TransportLike, lock: str, holder: Holder) -> bool:
    """True when the holder's heartbeat file grows while the host watches it for a few beats:
    its session is alive there, whatever a pid here says. One command; it sleeps on the host."""
    if not holder.token or not holder.token.isalnum():
        return False
    hb = q(heartbeat_path(lock, holder.token))
    span = round(2.5 * heartbeat_s() + 0.5, 2)
    r = t.run_script(f"a=$(stat -c %s {hb} 2>/dev/null) || exit 0; sleep {span}; "
                     f"b=$(stat -c %s {hb} 2>/dev/null) || exit 0; [ \"$a\" = \"$b\" ] || echo BEATING",
                     timeout=span + 30, check=False)
    return "BEATING" in r.stdout


def ended_here(t: TransportLike, lock: str, holder: Holder | None) -> bool:
    """A holder this controller may end by itself: its process is gone here (dead_here) and its
    session on the host is not alive either. Never the id alone."""
    return holder is not None and holder.dead_here() and not session_beating(t, lock, holder)

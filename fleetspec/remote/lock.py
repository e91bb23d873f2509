"""The per-service deploy lock: a flock held on the host by a process tied to our SSH session.

The holder is `flock -n LOCK cat`, reading from our channel. If fleetspec exits, is killed, or the
link drops, the channel closes, `cat` sees EOF and the kernel frees the lock: a dead holder never
blocks forever. A live holder is never stolen from: only `unlock --force` ends a holder, and it
refuses while the holder's pid is alive on the same machine. Who holds it is written beside it.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
from dataclasses import dataclass

import paramiko

from fleetspec.errors import RemoteError, UserError
from fleetspec.remote import files

q = shlex.quote
BUSY = 75


@dataclass(frozen=True)
class Holder:
    who: str
    machine: str
    pid: int
    since: float
    release: str
    remote_pid: int | None = None

    def describe(self) -> str:
        age = time.time() - self.since
        return (f"{self.who} (pid {self.pid} on {self.machine}, release {self.release}, "
                f"for {age:.0f}s)")

    def dead_here(self) -> bool:
        """True when the holder ran on this machine and its process is gone: a stale lock whose
        SSH session outlived it (a link cut leaves sshd holding it until TCP gives up)."""
        return self.machine == socket.gethostname() and self.remote_pid is not None and not self.alive_here()

    def alive_here(self) -> bool:
        """True when the holder is a live process on this machine (then it is never forced)."""
        if self.machine != socket.gethostname():
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


def acquire_script(lock: str, holder: Holder) -> str:
    """flock, then write the holder record with the remote holder's pid ($$ survives the exec)."""
    fields = {k: v for k, v in holder.__dict__.items() if k != "remote_pid"}
    head = json.dumps(fields, sort_keys=True)[:-1] + ', "remote_pid": '
    tmp = holder_path(lock) + files.TMP_SUFFIX
    inner = (f"printf '%s%s}}' {q(head)} \"$$\" > {q(tmp)} && mv -f {q(tmp)} {q(holder_path(lock))} "
             f"&& echo LOCKED $$ && exec cat >/dev/null")
    return f"mkdir -p \"$(dirname {q(lock)})\" && exec flock -n -E {BUSY} {q(lock)} sh -c {q(inner)}"


def read_holder(t, lock: str) -> Holder | None:
    text = t.run_script(files.read_optional(holder_path(lock), ""), timeout=30, check=True).stdout
    try:
        return Holder(**json.loads(text)) if text else None
    except (ValueError, TypeError):
        return None


def is_held(t, lock: str) -> bool:
    r = t.run_script(f"[ -e {q(lock)} ] || exit 0; flock -n {q(lock)} true", timeout=30, check=False)
    return r.rc != 0


class RemoteLock:
    def __init__(self, t, lock: str, *, release: str, note=lambda line: None):
        self.t, self.lock, self.note = t, lock, note
        self.holder = Holder(who=os.environ.get("USER") or str(os.getuid()), machine=socket.gethostname(),
                             pid=os.getpid(), since=time.time(), release=release)
        self.channel = None

    def __enter__(self) -> "RemoteLock":
        for attempt in (1, 2):
            self.channel = self.t.open_exec(acquire_script(self.lock, self.holder))
            line = _read_line(self.channel, timeout=30)
            if line.startswith("LOCKED"):
                return self
            # Its exit status may trail the end of its output: wait for it, briefly.
            rc = self.channel.recv_exit_status() if self.channel.status_event.wait(5) else None
            err = self.channel.recv_stderr(4096).decode(errors="replace").strip() \
                if self.channel.recv_stderr_ready() else ""
            self.channel.close()
            if rc not in (BUSY, None) or err:      # e.g. a read-only or full /var/lib/fleetspec
                raise RemoteError(f"{self.t.host.name}: could not take {self.lock}: "
                                  f"{(err or line).splitlines()[-1] if (err or line) else f'exit {rc}'}")
            if rc == BUSY or not line:
                holder = read_holder(self.t, self.lock)
                if attempt == 1 and holder is not None and holder.dead_here():
                    # Its process is gone from this machine; only its orphaned session holds on.
                    self.note(f"[{self.t.host.name}] ending a stale lock: {holder.describe()} is no longer running")
                    _end_holder(self.t, self.lock, holder)
                    continue
                who = holder.describe() if holder else "an unknown holder"
                raise UserError(f"{self.t.host.name}: {self.lock} is held by {who}; wait for it, or if that "
                                f"deploy is dead run: fleetspec unlock {self.t.host.name} --force")
            raise RemoteError(f"{self.t.host.name}: could not take {self.lock}: {line or 'no answer'}")
        raise RemoteError(f"{self.t.host.name}: could not take {self.lock}")

    def __exit__(self, *exc) -> None:
        try:
            self.t.run_script(f"rm -f {q(holder_path(self.lock))}", timeout=30, check=False)
        except RemoteError:
            pass    # the host is out of reach: the lock frees itself when our session ends
        finally:
            if self.channel is not None:
                try:
                    self.channel.shutdown_write()
                    self.channel.close()
                except (paramiko.SSHException, EOFError, OSError):
                    pass    # a dead link: the holder sees EOF when sshd drops our session


def force_unlock(t, lock: str) -> Holder | None:
    """End a stale holder. Refused while the holder's pid is alive on this machine."""
    if not is_held(t, lock):
        t.run_script(f"rm -f {q(holder_path(lock))}", timeout=30, check=False)
        return None
    holder = read_holder(t, lock)
    if holder is None or holder.remote_pid is None:
        raise UserError(f"{t.host.name}: {lock} is held but names no holder; inspect it with: fuser -v {lock}")
    if holder.alive_here():
        raise UserError(f"{t.host.name}: {lock} is held by {holder.describe()}, which is still running; "
                        f"not forcing it")
    _end_holder(t, lock, holder)
    return holder


def _end_holder(t, lock: str, holder: Holder) -> None:
    pid = int(holder.remote_pid)   # only ever the holder's `cat`, never a pid reused since
    t.run_script(f"[ \"$(cat /proc/{pid}/comm 2>/dev/null)\" = cat ] && kill {pid}; for i in 1 2 3 4 5 6 7 8 9 10; do "
                 f"flock -n {q(lock)} true && break; sleep 0.2; done; rm -f {q(holder_path(lock))}",
                 timeout=30, check=False)


def _read_line(channel, timeout: float) -> str:
    channel.settimeout(timeout)
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = channel.recv(1)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pass
    return data.decode(errors="replace").strip()

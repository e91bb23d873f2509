"""The per-service deploy lock: a flock held on the host by a process tied to our SSH session.

The holder is `flock -n LOCK cat`, reading from our channel. If fleetspec exits, is killed, or the
link drops, the channel closes, `cat` sees EOF and the kernel frees the lock: a dead holder never
blocks forever. While we hold it, a thread sends a heartbeat line down the channel every few
seconds and `cat` appends it to the holder's heartbeat file, so the host itself can tell a live
session (fresh heartbeat) from an orphaned one (a link cut leaves sshd holding it for a while).

Holders are told apart by a persistent random controller id (fleetspec.identity), never by the
hostname, and each holding by a random token. A holder is ended only when it is provably gone:
by anyone when its controller is ours on this machine and boot, its pid is dead here and its
heartbeat file has stopped growing (remote/lock_holder.py); by `unlock --force` only when that is
so or its heartbeat on the host is stale. The holder's record is
`LOCK.holders/<token>.json` (`LOCK.holder` points at the current one), so a holder removes only
its own files and never a newer holder's. Every step that changes the host first checks, in the
same remote command, that the lock is still ours (`guard`), and stops if it is not.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import threading
import time
from typing import Sequence

from fleetspec.errors import RemoteError, UserError
from fleetspec.identity import controller_id, machine_boot
from fleetspec.remote import files
from fleetspec.remote.api import Channel, TransportLike
from fleetspec.remote.lock_holder import (
    Holder,
    ended_here,
    heartbeat_age,
    heartbeat_path,
    heartbeat_s,
    holder_path,
    holders_dir,
    read_holder,
    record_path,
    stale_after_s,
)
from fleetspec.remote.ssh_lib import paramiko

q = shlex.quote
BUSY = 75
LOST = 75
LOST_MARKER = "FLEETSPEC-LOCK-LOST"


class LockLost(RemoteError):
    """The lock this process took is no longer its own (ended by `unlock --force`, or its session
    died): nothing more may be changed on the host."""


def _link_target(lock: str, token: str) -> str:
    """What LOCK.holder points at (relative, so the state folder can move)."""
    return f"{os.path.basename(holders_dir(lock))}/{token}.json"


READ_ABSENT, READ_FAILED = "A", "E"


def read_under_lock(path: str) -> str:
    """One line: `T <base64 of path>`, READ_ABSENT or READ_FAILED (acquire_script's `read`)."""
    return (f"if [ -e {q(path)} ]; then b=$(base64 -w0 -- {q(path)}) && printf 'T %s\\n' \"$b\" "
            f"|| echo {READ_FAILED}; else echo {READ_ABSENT}; fi")


def readlink_under_lock(path: str) -> str:
    """One line: `T <base64 of readlink's output>`, or READ_ABSENT when `path` is no symlink."""
    return (f"if l=$(readlink -- {q(path)}); then printf 'T %s\\n' \"$(printf %s \"$l\" | base64 -w0)\"; "
            f"else echo {READ_ABSENT}; fi")


def _reads(read: str | Sequence[str] | None) -> tuple[str, ...]:
    return (read,) if isinstance(read, str) else tuple(read or ())


def acquire_script(lock: str, holder: Holder, read: str | Sequence[str] | None = None, link: str | None = None) -> str:
    """flock, then (holding it) clear earlier holders' leftovers, write our record with the remote
    holder's pid ($$ survives the exec), point LOCK.holder at it, and append heartbeats to our file.
    `read`: files to print (read_under_lock, one line each) after LOCKED, then `link`'s target
    (readlink_under_lock): read while the lock is held, so no command of their own."""
    if not holder.token or not holder.token.isalnum():
        raise ValueError("a lock holder needs an alphanumeric token")
    fields = {k: v for k, v in holder.__dict__.items() if k != "remote_pid"}
    head = json.dumps(fields, sort_keys=True)[:-1] + ', "remote_pid": '
    hd, rec, hb, lk = holders_dir(lock), record_path(lock, holder.token), heartbeat_path(lock, holder.token), holder_path(lock)
    reads = [read_under_lock(p) for p in _reads(read)] + ([readlink_under_lock(link)] if link else [])
    inner = (f"mkdir -p {q(hd)} && for f in {q(hd)}/*; do case \"$f\" in {q(hd)}/{holder.token}.*) ;; "
             f"*) rm -f -- \"$f\" ;; esac; done; "
             f"printf '%s%s}}' {q(head)} \"$$\" > {q(rec + files.TMP_SUFFIX)} && mv -f {q(rec + files.TMP_SUFFIX)} {q(rec)} "
             f"&& ln -sfn {q(_link_target(lock, holder.token))} {q(lk + files.TMP_SUFFIX)} "
             f"&& mv -Tf {q(lk + files.TMP_SUFFIX)} {q(lk)} "
             f"&& : > {q(hb)} && echo LOCKED $$ && {{ {'; '.join(reads) or ':'}; }} "
             f"&& exec cat >> {q(hb)}")
    return f"mkdir -p \"$(dirname {q(lock)})\" && exec flock -n -E {BUSY} {q(lock)} sh -c {q(inner)}"


def guard_script(lock: str, token: str, remote_pid: int) -> str:
    """Shell that exits LOST (printing LOST_MARKER) unless this holding still holds the lock:
    LOCK.holder names our record and our holder process (which keeps the flock) is alive: its
    `cat`, or the holder shell itself in the moment between printing LOCKED (and the ledger) and
    its `exec cat` (its command line carries our token), which a loaded host makes visible."""
    proc = f"/proc/{int(remote_pid)}"
    return (f"{{ [ \"$(readlink {q(holder_path(lock))} 2>/dev/null)\" = {q(_link_target(lock, token))} ] "
            f"&& {{ [ \"$(cat {proc}/comm 2>/dev/null)\" = cat ] || grep -qaF {q(token)} {proc}/cmdline 2>/dev/null; }}; }} "
            f"|| {{ echo {LOST_MARKER} >&2; exit {LOST}; }}")


def is_held(t: TransportLike, lock: str) -> bool:
    r = t.run_script(f"[ -e {q(lock)} ] || exit 0; flock -n {q(lock)} true", timeout=30, check=False)
    return r.rc != 0


def busy_message(host: str, lock: str, holder: Holder | None) -> str:
    who = holder.describe() if holder else "an unknown holder"
    return f"{host}: {lock} is held by {who}; wait for it, or if that deploy is dead run: fleetspec unlock {host} --force"


def busy(t: TransportLike, lock: str) -> UserError | None:
    """The refusal a deploy would meet at the lock now, found without taking it (preflight's
    read-only look); None when the lock is free or its holder's process is gone from this
    controller (taking the lock ends that one)."""
    if not is_held(t, lock):
        return None
    holder = read_holder(t, lock)
    if ended_here(t, lock, holder):
        return None
    return UserError(busy_message(t.host.name, lock, holder))


class RemoteLock:
    def __init__(self, t: TransportLike, lock: str, *, release: str, note=lambda line: None, holder: Holder | None = None,
                 heartbeat: bool = True, read: str | Sequence[str] | None = None, link: str | None = None):
        self.t, self.lock, self.note, self.read, self.link = t, lock, note, _reads(read), link
        self.read_texts: dict[str, str | None] = {}   # each `read` path's text as read under the lock (None: absent)
        self.link_target: str | None = None           # `link`'s readlink under the lock ("": no symlink)
        self._files_removed = False
        self.holder = holder or Holder(who=os.environ.get("USER") or str(os.getuid()), machine=socket.gethostname(),
                                       pid=os.getpid(), since=time.time(), release=release,
                                       controller=controller_id(), token=secrets.token_hex(16), boot=machine_boot())
        self.channel: Channel | None = None
        self.remote_pid: int | None = None
        self._heartbeat = heartbeat
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None

    def __enter__(self) -> "RemoteLock":
        for attempt in (1, 2):
            self.channel = self.t.open_exec(acquire_script(self.lock, self.holder, self.read, self.link))
            line = _read_line(self.channel, timeout=30)
            if line.startswith("LOCKED"):
                self.remote_pid = int(line.split()[1])
                if self.read or self.link:
                    self._read_held()
                if self._heartbeat:
                    self._beats = threading.Thread(target=self._beat, name="lock-heartbeat", daemon=True)
                    self._beats.start()
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
                for _ in range(10):     # the winner writes its record just after it takes the flock
                    if holder is not None:
                        break
                    time.sleep(0.2)
                    holder = read_holder(self.t, self.lock)
                if attempt == 1 and holder is not None and holder.remote_pid is not None and ended_here(self.t, self.lock, holder):
                    # Its process is gone from this controller; only its orphaned session holds on.
                    self.note(f"[{self.t.host.name}] ending a stale lock: {holder.describe()} is no longer running")
                    _end_holder(self.t, self.lock, holder, holder.remote_pid)
                    continue
                raise UserError(busy_message(self.t.host.name, self.lock, holder))
            raise RemoteError(f"{self.t.host.name}: could not take {self.lock}: {line or 'no answer'}")
        raise RemoteError(f"{self.t.host.name}: could not take {self.lock}")

    @property
    def read_text(self) -> str | None:
        """The first `read` path's text (the ledger, for a deploy)."""
        return self.read_texts.get(self.read[0]) if self.read else None

    def _read_held(self) -> None:
        """The holder's lines after LOCKED: one per `read` path, then `link`'s (nothing follows them)."""
        import base64

        names = [*self.read, *([self.link] if self.link else [])]
        lines = _read_line(self.channel, timeout=60, chunk=65536, lines=len(names)).split("\n")
        for i, name in enumerate(names):
            line = lines[i].strip() if i < len(lines) else ""
            if line == READ_ABSENT:
                text = None
            elif line == "T" or line.startswith("T "):
                text = base64.b64decode(line[2:]).decode("utf-8", "replace")
            else:
                self.__exit__(None, None, None)
                raise RemoteError(f"{self.t.host.name}: could not read {name} under {self.lock}: "
                                  f"{line[:200] or 'no answer'}")
            if name == self.link and i == len(self.read):
                self.link_target = text or ""
            else:
                self.read_texts[name] = text

    def _beat(self) -> None:
        channel = self.channel
        while channel is not None and not self._stop.wait(heartbeat_s()):
            try:
                channel.send(b"\n")
            except (paramiko.SSHException, EOFError, OSError, socket.timeout):
                return            # a dead link: the host sees the heartbeat go stale

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beats is not None:
            self._beats.join(timeout=10)

    def guard(self) -> str:
        """The shell check that this holding is still the lock's, for a step's own command."""
        if self.remote_pid is None:
            raise RuntimeError("guard() of a lock not held")
        return guard_script(self.lock, self.holder.token, self.remote_pid)

    def check(self, result) -> None:
        """Raise LockLost if a command that started with guard() stopped because the lock is lost."""
        if result.rc == LOST and LOST_MARKER in result.stderr:
            now = None
            try:
                now = read_holder(self.t, self.lock)
            except RemoteError:
                pass
            who = f"; it is now held by {now.describe()}" if now is not None and now.token != self.holder.token else ""
            raise LockLost(f"{self.t.host.name}: lost the lock on {self.lock} (ended by someone else, or our session "
                           f"on the host died){who}; stopped without changing anything more")

    def remove_files(self, t: TransportLike, before: str = "", timeout: float = 30):
        """Remove our record and heartbeat now, through `t` (one whose commands carry the last
        ledger lines: then that write and this cost one command); __exit__ then only closes.
        `before`: the caller's last work (a deploy's prune), run first in the same command; the
        files go whatever it does. Returns the command's result."""
        r = t.run_script((f"{before}\n" if before else "") + self._remove_script(), timeout=timeout, check=False)
        self._files_removed = True
        return r

    def _remove_script(self) -> str:
        # only our own record and heartbeat: LOCK.holder may already name a newer holder
        return f"rm -f {q(record_path(self.lock, self.holder.token))} {q(heartbeat_path(self.lock, self.holder.token))}"

    def __exit__(self, *exc) -> None:
        self.stop_heartbeat()
        try:
            if not self._files_removed:
                self.t.run_script(self._remove_script(), timeout=30, check=False)
        except RemoteError:
            pass    # the host is out of reach: the lock frees itself when our session ends
        finally:
            if self.channel is not None:
                try:
                    self.channel.shutdown_write()
                    self.channel.close()
                except (paramiko.SSHException, EOFError, OSError):
                    pass    # a dead link: the holder sees EOF when sshd drops our session


def force_unlock(t: TransportLike, lock: str) -> Holder | None:
    """End a stale holder. Refused while the holder is alive: its process is alive on this
    controller, or its session on the host still sends heartbeats (whoever's controller it is)."""
    if not is_held(t, lock):
        t.run_script(f"rm -f {q(holder_path(lock))}", timeout=30, check=False)
        return None
    holder = read_holder(t, lock)
    if holder is None or holder.remote_pid is None:
        raise UserError(f"{t.host.name}: {lock} is held but names no holder; inspect it with: fuser -v {lock}")
    if holder.alive_here():
        raise UserError(f"{t.host.name}: {lock} is held by {holder.describe()}, which is still running; "
                        f"not forcing it")
    age = heartbeat_age(t, lock, holder)
    if age is None:
        raise UserError(f"{t.host.name}: {lock} is held by {holder.describe()}, which keeps no heartbeat, so "
                        f"whether its session is alive cannot be told; if it is dead, end it on the host: "
                        f"kill {int(holder.remote_pid)}")
    if age <= stale_after_s():
        raise UserError(f"{t.host.name}: {lock} is held by {holder.describe()}, whose session on the host is "
                        f"still alive (heartbeat {age:.0f}s ago); not forcing it")
    _end_holder(t, lock, holder, int(holder.remote_pid))
    return holder


def _end_holder(t: TransportLike, lock: str, holder: Holder, pid: int) -> None:
    """Kill the holder's `cat` (only that: checked by name, never a pid reused since), wait for the
    flock to free, and remove that holder's files only. A legacy plain-file record is removed too."""
    own = ""
    if holder.token and holder.token.isalnum():
        own = f"rm -f {q(record_path(lock, holder.token))} {q(heartbeat_path(lock, holder.token))}; "
    legacy = f"[ -L {q(holder_path(lock))} ] || rm -f {q(holder_path(lock))}"
    t.run_script(f"[ \"$(cat /proc/{pid}/comm 2>/dev/null)\" = cat ] && kill {pid}; for i in 1 2 3 4 5 6 7 8 9 10; do "
                 f"flock -n {q(lock)} true && break; sleep 0.2; done; {own}{legacy}",
                 timeout=30, check=False)


def _read_line(channel, timeout: float, chunk: int = 1, lines: int = 1) -> str:
    """One line (`lines` lines) from `channel`, a byte at a time so nothing after it is consumed;
    `chunk` > 1 for long lines (files' base64) that nothing follows."""
    channel.settimeout(timeout)
    data = b""
    try:
        while not (data.endswith(b"\n") and data.count(b"\n") >= lines):
            got = channel.recv(chunk)
            if not got:
                break
            data += got
    except socket.timeout:
        pass
    return data.decode(errors="replace").strip()

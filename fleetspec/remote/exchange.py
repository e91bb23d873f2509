"""Both directions of one exec channel, until the command exits and its output ends.

Every SSH command runs through one `Exchange`: `Transport.run` writes its stdin and reads to the
end, the stage command also reads the host's request for objects part-way and answers on the same
stdin. One read loop, so the exit-before-EOF grace and the deadline behave alike everywhere.
"""

from __future__ import annotations

import select
import time

from fleetspec.errors import RemoteError, Unreachable
from fleetspec.remote import limits
from fleetspec.remote.ssh_lib import paramiko

CHUNK = 65536
CLOSED = (OSError, EOFError, paramiko.SSHException)
EOF_GRACE_S = 5.0     # exited without EOF: a child left in the background may hold the pipe
LOST_SETTLE_S = 0.5   # a channel closed without a status: how long its connection may take to be seen dead
IDLE_WAKE_S = 1.0     # data, EOF and a close wake the select at once; this only paces the clocks


def short(command: str, n: int = 120) -> str:
    one = " ".join(command.split())
    return one if len(one) <= n else one[: n - 3] + "..."


class Exchange:
    """stdin written, stdout/stderr collected, for one channel whose command already started.

    A failed write is not an error by itself: the command may have ended first, and its exit
    status and stderr say why (`lost` keeps the write's error for when they do not). A link that
    dies while reading, or the deadline, raises RemoteError naming the host and the command."""

    def __init__(self, chan, host: str, shown: str, timeout: float, limit: int | None = None):
        self.chan, self.host, self.shown, self.timeout = chan, host, shown, timeout
        self.limit = limit or limits.COMMAND_OUTPUT_MAX
        self.deadline = time.monotonic() + timeout
        self.out, self.err = bytearray(), bytearray()
        self.lost: str | None = None
        self._exited_at: float | None = None

    def send(self, data: bytes | None) -> None:
        if data is None or self.lost is not None:
            return
        view = memoryview(data)
        try:
            self.chan.settimeout(max(1.0, self.deadline - time.monotonic()))   # a dead link never blocks a write forever
            while view:
                view = view[self.chan.send(view[:CHUNK]):]
        except CLOSED as err:
            self.lost = f"the host stopped reading: {err}"

    def shutdown_write(self) -> None:
        """Our EOF, sent under the channel's lock and not at all once the channel is closed.
        paramiko's own shutdown_write sends it after releasing the lock, so the transport thread
        can answer the host's CLOSE in between; an EOF after our CLOSE names a channel the host
        has freed, and OpenSSH then drops the whole connection ("ieof packet referred to
        nonexistent channel"), every other command on it with it."""
        if self.lost is not None:
            return
        chan = self.chan
        try:
            with chan.lock:
                if chan.closed or chan.eof_sent:
                    return
                message = chan._send_eof()
                if message is not None and chan.transport is not None:
                    chan.transport._send_user_message(message)
        except CLOSED as err:
            self.lost = f"the host stopped reading: {err}"

    def line_starting(self, marker: bytes) -> str | None:
        """The first whole stdout line that is `marker` or starts with `marker` and a space; None
        when the command ended without printing one."""
        while True:
            for line in bytes(self.out).split(b"\n")[:-1]:
                if line == marker or line.startswith(marker + b" "):
                    return line.decode()
            if self._ended():
                return None
            self._pump()

    def finish(self) -> int:
        """Read to the end; the command's exit status (a closed channel ends the read: _ended)."""
        while not self._ended():
            self._pump()
        self._drain()
        self._raise_if_lost()
        return self.chan.recv_exit_status()

    def _raise_if_lost(self) -> None:
        """paramiko closes every channel of a connection that died and marks its status ready
        with no status (-1): without this check such a command read as one that printed
        nothing and exited -1. A channel closed by a live connection without a status is a
        command ended by a signal (OpenSSH's exit-signal, which paramiko does not keep): -1.
        paramiko closes the channels before it marks the connection inactive, so a dying
        connection's reader thread is given LOST_SETTLE_S to end."""
        c = self.chan
        if not (c.closed and c.exit_status == -1):
            return
        reader = c.get_transport()
        reader.join(LOST_SETTLE_S)
        if not reader.is_active():
            raise RemoteError(f"{self.host}: connection lost during {short(self.shown)}")

    def _ended(self) -> bool:
        c = self.chan
        if not c.exit_status_ready() or c.recv_ready() or c.recv_stderr_ready():
            return False
        if c.eof_received or c.closed:
            return True
        self._exited_at = self._exited_at or time.monotonic()
        return time.monotonic() - self._exited_at > EOF_GRACE_S

    def _pump(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Unreachable(f"{self.host}: command timed out after {self.timeout:g}s: {short(self.shown)}"
                              + (f" ({self.lost})" if self.lost else ""))
        try:
            if self.chan.eof_received:   # nothing can follow EOF but the exit status or a close, and
                self.chan.status_event.wait(min(left, IDLE_WAKE_S))   # select would return at once
            else:
                select.select([self.chan], [], [], min(left, IDLE_WAKE_S))
            self._drain()
        except CLOSED as err:
            raise RemoteError(f"{self.host}: connection lost during {short(self.shown)}: {err}") from None

    def _drain(self) -> None:
        out, err = drain(self.chan, self.limit + 1 - len(self.out), self.limit + 1 - len(self.err))
        self.out += out
        self.err += err
        for name, got in (("stdout", self.out), ("stderr", self.err)):
            if len(got) > self.limit:
                raise RemoteError(f"{self.host}: {short(self.shown)} wrote more than {limits.size(self.limit)} on {name}; "
                                  f"fleetspec reads at most that much of a command's output")


def close_quietly(chan) -> None:
    """A channel of a connection that died raises on close (EOFError from paramiko's writer):
    the command's own error, already raised or about to be, is the one to report."""
    try:
        chan.close()
    except CLOSED:
        pass


def drain(chan, out_room: int | None = None, err_room: int | None = None) -> tuple[bytes, bytes]:
    """What the channel holds now on stdout and on stderr, without waiting; at most about
    `out_room`/`err_room` bytes of each (a host that writes without end keeps it filled)."""
    out, err = bytearray(), bytearray()
    while chan.recv_ready() and (out_room is None or len(out) < out_room):
        out += chan.recv(CHUNK)
    while chan.recv_stderr_ready() and (err_room is None or len(err) < err_room):
        err += chan.recv_stderr(CHUNK)
    return bytes(out), bytes(err)

"""File transfer over a host's SSH connection: SFTP as root, `cat` under sudo; writes atomic and durable.

A part of `transport.Transport` (held as `Transport.transfer`, as Fabric's Connection holds a
Transfer): it keeps its own SFTP session and uses the connection's `connect`, `name`, `host`,
`needs_sudo`, `run` and `run_script`.
"""

from __future__ import annotations

import secrets
import shlex
import socket
import stat
import threading
import time
from pathlib import PurePosixPath
from typing import Callable

from fleetspec.errors import RemoteError
from fleetspec.remote.api import TransportLike
from fleetspec.remote.limits import FILE_MAX, size
from fleetspec.remote.observe import _observe
from fleetspec.remote.ssh_lib import paramiko


class FileTransfer:
    """put_bytes/get_bytes over one connection (`conn`; `connect` returns its paramiko transport)."""

    def __init__(self, conn: TransportLike, connect: Callable[[], paramiko.Transport]):
        self.conn, self.connect = conn, connect
        self._lock = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def name(self) -> str:
        return self.conn.name

    def _sftp_client(self) -> paramiko.SFTPClient:
        ssh = self.connect()
        with self._lock:
            if self._sftp is None or self._sftp.sock.closed:
                self._sftp = paramiko.SFTPClient.from_transport(ssh)
                # Without a timeout a transfer over a link that died blocks until TCP gives up
                # (~15 min): fail once no byte moved for this long.
                self._sftp.get_channel().settimeout(self.io_timeout)
            return self._sftp

    @property
    def io_timeout(self) -> float:
        return float(min(self.conn.host.command_timeout, 60))

    def close(self) -> None:
        """End the SFTP session (the connection is the caller's)."""
        self._drop_sftp()

    def _drop_sftp(self) -> None:
        with self._lock:
            sftp, self._sftp = self._sftp, None
        if sftp is not None:
            try:
                sftp.close()
            except Exception:  # closing is best effort
                pass

    def put_bytes(self, data: bytes, path: str, mode: int = 0o644, durable: bool = True) -> None:
        """Write `path` atomically: a temp file beside it (never readable by others while it is
        written), chmod, fsync, then rename over the target and fsync the folder (`durable`;
        content-addressed objects skip it: a torn one fails its hash check where it is used)."""
        began = time.monotonic()
        what = f"put {path} ({len(data)} bytes, mode {mode:o})"
        try:
            self._put_bytes_inner(data, path, mode, durable)
        except RemoteError as err:
            _observe(self.name, what, began, f"error: {str(err).removeprefix(self.name + ': ')}")
            raise
        _observe(self.name, what, began, "ok")

    def _put_bytes_inner(self, data: bytes, path: str, mode: int, durable: bool) -> None:
        tmp = f"{path}.fleetspec-tmp-{secrets.token_hex(6)}"
        q = shlex.quote
        folder = str(PurePosixPath(path).parent)
        rename = (f"sync -- {q(tmp)} && mv -f -- {q(tmp)} {q(path)} && sync -- {q(folder)}" if durable
                  else f"mv -f -- {q(tmp)} {q(path)}")
        if self.conn.needs_sudo:
            script = (f"umask 077; cat > {q(tmp)} && chmod {mode:o} {q(tmp)} && {rename} "
                      f"|| {{ rc=$?; rm -f {q(tmp)}; exit $rc; }}")
            self.conn.run_script(script, check=True, stdin=data)
            return
        sftp = self._sftp_client()
        try:
            with sftp.open(tmp, "wb") as f:
                f.chmod(0o600)              # created at the server's umask: tighten before any byte
                f.set_pipelined(True)
                f.write(data)
            sftp.chmod(tmp, mode)
            if not durable:
                sftp.posix_rename(tmp, path)
        except (OSError, paramiko.SSHException) as err:
            if isinstance(err, (socket.timeout, TimeoutError)):
                self._drop_sftp()
                raise RemoteError(f"{self.name}: connection lost while writing {path}: no progress for "
                                  f"{self.io_timeout:g}s") from None
            try:
                sftp.remove(tmp)
            except (OSError, paramiko.SSHException):
                pass
            raise RemoteError(f"{self.name}: cannot write {path}: {err}") from None
        if durable:   # SFTP has no fsync paramiko can send: one command syncs, renames and syncs the folder
            r = self.conn.run_script(f"{rename} || {{ rc=$?; rm -f -- {q(tmp)}; exit $rc; }}", timeout=self.io_timeout)
            if not r.ok:
                raise RemoteError(f"{self.name}: cannot write {path}: {(r.stderr.strip() or f'exit {r.rc}')[:300]}")

    def get_bytes(self, path: str) -> bytes:
        began = time.monotonic()
        try:
            data = self._get_bytes_inner(path)
        except RemoteError as err:
            _observe(self.name, f"get {path}", began, f"error: {str(err).removeprefix(self.name + ': ')}")
            raise
        _observe(self.name, f"get {path}", began, f"ok ({len(data)} bytes)")
        return data

    def _get_bytes_inner(self, path: str) -> bytes:
        """A regular file of at most FILE_MAX bytes (remote/limits.py), whole."""
        if self.conn.needs_sudo:
            q = shlex.quote
            script = (f"if [ -f {q(path)} ]; then exec cat -- {q(path)}; fi; "
                      f"printf '%s\\n' {q(path + ': not a regular file')} >&2; exit 1")
            return self.conn.run_script(script, check=True).stdout_bytes
        sftp = self._sftp_client()
        try:
            st = sftp.stat(path)
            if not stat.S_ISREG(st.st_mode or 0):
                raise RemoteError(f"{self.name}: {path} is not a regular file; refusing to read it")
            if (st.st_size or 0) > FILE_MAX:
                raise RemoteError(f"{self.name}: {path} is larger than {size(FILE_MAX)}; fleetspec reads at most that")
            with sftp.open(path, "rb") as f:
                f.prefetch()
                data = f.read(FILE_MAX + 1)
            if len(data) > FILE_MAX:
                raise RemoteError(f"{self.name}: {path} grew past {size(FILE_MAX)} while it was read")
            return data
        except FileNotFoundError:
            raise RemoteError(f"{self.name}: {path}: no such file") from None
        except (OSError, paramiko.SSHException) as err:
            if isinstance(err, (socket.timeout, TimeoutError)):
                self._drop_sftp()
                raise RemoteError(f"{self.name}: connection lost while reading {path}: no progress for "
                                  f"{self.io_timeout:g}s") from None
            raise RemoteError(f"{self.name}: cannot read {path}: {err}") from None

"""The one place fleetspec talks SSH: commands, atomic file writes, and HTTP to the host's loopback.

One paramiko connection per host, reused by every call (channels are cheap, handshakes are not),
with TCP_NODELAY (Nagle cost ~40 ms per round trip). Host keys are checked against the
inventory's known_hosts (remote/hostkeys.py): an unknown key is refused unless the policy is
accept-new or the user passed --accept-new-host-key (then it is recorded); a changed key is always
refused. Only the connect is retried — a command is never run twice. File transfer and HTTP ride
on the same connection: the Transport holds them (`transfer`: remote/transfer.py, `web`:
remote/http.py), as Fabric's Connection holds its Transfer.
"""

from __future__ import annotations

import shlex
import socket
import threading
import time
from typing import Any, Sequence

from fleetspec.errors import RemoteError, UserError
from fleetspec.model.inventory import Host
from fleetspec.remote.api import Channel, CommandResult, HttpResponse, Prelude, TransportLike
from fleetspec.remote.become import SUDO_PROBE, become_sudo, sudo_problem
from fleetspec.remote.exchange import Exchange, close_quietly, short
from fleetspec.remote.hostkeys import HostKeyError, _load_keys, check_host_key, fingerprint
from fleetspec.remote.http import HttpOverSsh
from fleetspec.remote.observe import (
    _observe,
    _observe_route,
    add_observer,
    add_route_observer,
    redact,
    remove_observer,
    remove_route_observer,
)
from fleetspec.remote.ssh_config import Hop, Reach, reach
from fleetspec.remote.ssh_lib import paramiko
from fleetspec.remote.transfer import FileTransfer

__all__ = ["CommandResult", "HostKeyError", "HttpResponse", "Transport", "TransportLike", "TransportPool",
           "add_observer", "add_route_observer", "check_host_key", "fingerprint", "redact", "remove_observer",
           "remove_route_observer"]


class _Retryable(Exception):
    """A connect failure worth another try (refused, reset, timed out before the handshake)."""


# paramiko's reader thread wakes every 0.1 s when its socket is quiet (paramiko.Transport's
# socket timeout, _active_check_timeout) only to look whether the transport was closed; close() does not wait for
# it. Per connection that is ~1.2 ms of controller CPU a second (bench/RESULTS.md), which grows with
# every host and every second a deploy waits for an engine: 1 s cuts it ~7×; keepalives (30 s) and
# incoming data are not delayed by it.
READER_WAKE_S = 1.0

# AES-GCM first: paramiko checks a CTR+HMAC packet's MAC in a Python loop over its bytes
# (util.constant_time_bytes_eq), where GCM's tag is checked inside `cryptography`: ~7% less client
# CPU per small command here (bench/ssh_overhead.py), more per packet of a long output. OpenSSH has
# offered both since 6.2; a server that does not falls through to paramiko's own order.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _prefer_aead(options: paramiko.SecurityOptions) -> None:
    first = tuple(c for c in PREFERRED_CIPHERS if c in options.ciphers)
    options.ciphers = first + tuple(c for c in options.ciphers if c not in first)


class Transport:
    """SSH to one host (see module docstring); thread-safe for concurrent commands."""

    def __init__(self, host: Host, accept_new_host_key: bool = False):
        self.host = host
        self.accept_new = accept_new_host_key or host.host_key_policy == "accept-new"
        self._lock = threading.Lock()
        self._ssh: paramiko.Transport | None = None
        self._jumps: list[paramiko.Transport] = []
        self._reach: Reach | None = None
        self._access_ok = False
        self.transfer = FileTransfer(self, self.connect)
        self.web = HttpOverSsh(host.name, self.connect)

    # ---- file transfer and HTTP (the parts this connection holds) ---------------------------

    def put_bytes(self, data: bytes, path: str, mode: int = 0o644, durable: bool = True) -> None:
        self.transfer.put_bytes(data, path, mode, durable)

    def get_bytes(self, path: str) -> bytes:
        return self.transfer.get_bytes(path)

    def http(self, method: str, port: int, path: str, json: Any = None, timeout: float = 5,
             headers: dict[str, str] | None = None) -> HttpResponse:
        return self.web.http(method, port, path, json, timeout, headers)

    # ---- connection ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def reach(self) -> Reach:
        """The route: the inventory's values over ssh_config's (remote/ssh_config.py), read once."""
        if self._reach is None:
            self._reach = reach(self.host)
        return self._reach

    def connect(self) -> paramiko.Transport:
        with self._lock:
            if self._ssh is not None and self._ssh.is_active():
                return self._ssh
            self._close_locked()
            r = self.reach
            began = time.monotonic()
            deadline = began + self.host.connect_timeout
            try:
                self._ssh = self._connect_retrying(deadline)
            except _Retryable as err:
                via = "".join(f" via {j}" for j in reversed(r.jumps))
                raise RemoteError(f"{self.name}: cannot reach {r.target.address}:{r.target.port}{via}: {err}") from None
            _observe_route(self.name, r.describe(), began)
            return self._ssh

    def _connect_retrying(self, deadline: float) -> paramiko.Transport:
        """_connect_once, then on a retryable failure tenacity's exponential wait (0.2 s up to 2 s)
        until the deadline; the last _Retryable is raised. tenacity is imported only once a first
        try failed: a CLI start that connects at once does not pay for its import."""
        try:
            return self._connect_once(deadline)
        except _Retryable:
            if time.monotonic() + 0.2 >= deadline:
                raise
        import tenacity

        retry = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_before_delay(max(0.0, deadline - time.monotonic())),
            wait=tenacity.wait_exponential(multiplier=0.2, max=2),
            before=tenacity.before_nothing, sleep=time.sleep, reraise=True)
        time.sleep(0.2)
        return retry(self._connect_once, deadline)

    def _connect_once(self, deadline: float) -> paramiko.Transport:
        r = self.reach
        remaining = max(0.1, deadline - time.monotonic())
        sock = self._jump_channel(remaining) if r.jumps else self._socket(r.target, remaining, "")
        return self._handshake(sock, r.target, deadline)

    def _socket(self, hop: Hop, timeout: float, what: str) -> socket.socket:
        try:
            sock = socket.create_connection((hop.address, hop.port), timeout=timeout)
        except socket.gaierror as err:  # a name that does not resolve will not start to
            raise RemoteError(f"{self.name}: cannot resolve {what}{hop.address}: {err.strerror or err}") from None
        except (ConnectionError, socket.timeout, TimeoutError, OSError) as err:
            raise _Retryable((f"{what}{hop}: " if what else "") + (str(err) or type(err).__name__)) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _give_up_on_dead_links(sock, self.host.connect_timeout)
        return sock

    def _jump_channel(self, timeout: float):
        """A direct-tcpip channel to the target through each ProxyJump hop in turn (outermost first);
        the hops' connections are kept open for the next connect."""
        r = self.reach
        if not (self._jumps and all(j.is_active() for j in self._jumps)):
            self._close_jumps()
            deadline = time.monotonic() + timeout
            sock = self._socket(r.jumps[0], timeout, "jump host ")
            for i, hop in enumerate(r.jumps):
                if i:
                    sock = self._channel(self._jumps[-1], hop, deadline - time.monotonic(), r.jumps[i - 1])
                self._jumps.append(self._handshake(sock, hop, deadline))
        return self._channel(self._jumps[-1], r.target, timeout, r.jumps[-1])

    @staticmethod
    def _channel(through: paramiko.Transport, to: Hop, timeout: float, via: Hop):
        try:
            return through.open_channel("direct-tcpip", (to.address, to.port), ("127.0.0.1", 0),
                                        timeout=max(0.1, timeout))
        except (paramiko.ChannelException, paramiko.SSHException, OSError) as err:
            raise _Retryable(f"via jump {via}: {err}") from None

    def _handshake(self, sock, hop: Hop, deadline: float) -> paramiko.Transport:
        t = paramiko.Transport(sock)
        sock.settimeout(READER_WAKE_S)     # after paramiko's own 0.1 s (set in its __init__)
        _prefer_aead(t.get_security_options())
        address, port, user = hop.address, hop.port, hop.user
        try:
            t.banner_timeout = t.auth_timeout = max(1.0, deadline - time.monotonic())
            try:
                t.start_client(timeout=max(1.0, deadline - time.monotonic()))
            except (paramiko.SSHException, EOFError, OSError) as err:
                raise _Retryable(f"SSH handshake with {address}:{port} failed: {err}") from None
            check_host_key(self.name, hop.known_hosts_name, t.get_remote_server_key(), self.host.known_hosts,
                           self.accept_new)
            errors = []
            for key in _load_keys(self.host, hop.keys or self.reach.target.keys):
                try:
                    t.auth_publickey(user, key)
                except paramiko.AuthenticationException as err:
                    errors.append(str(err))
                    continue
                except (paramiko.SSHException, EOFError, OSError) as err:
                    raise _Retryable(f"auth with {address}:{port}: {err}") from None
                if t.is_authenticated():
                    break
            if not t.is_authenticated():
                shown = hop.keys or self.reach.target.keys or ((self.host.ssh_key,) if self.host.ssh_key else ())
                raise RemoteError(f"{self.name}: {user}@{address}:{port} refused our key"
                                  f"{' (' + ', '.join(map(str, shown)) + ')' if shown else ''}")
            t.set_keepalive(30)
            return t
        except BaseException:
            t.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self.transfer.close()
        if self._ssh is not None:
            try:
                self._ssh.close()
            except Exception:  # closing is best effort
                pass
        self._ssh = None
        self._close_jumps()

    def _close_jumps(self) -> None:
        for jump in reversed(self._jumps):
            try:
                jump.close()
            except Exception:  # closing is best effort
                pass
        self._jumps = []

    # ---- commands --------------------------------------------------------------------------

    @property
    def needs_sudo(self) -> bool:
        """become: sudo, or, where the inventory named neither user nor become, a user other than
        root that ssh_config chose (as the inventory would have defaulted for that user)."""
        if {"user", "become"} & self.host.inventory_sets:
            return self.host.become == "sudo"
        return self.host.become == "sudo" or self.reach.target.user != "root"

    def _wrap(self, script: str) -> str:
        return become_sudo(script) if self.needs_sudo else f"sh -c {shlex.quote(script)}"

    carries_preludes = True     # run/run_script take a `prelude` (ops/hoststate.py's ledger lines)

    def host_key(self) -> str:
        """The fingerprint of the key this host proved it holds on connecting (checked against
        known_hosts there): what the controller's mirror of this host is bound to."""
        return fingerprint(self.connect().get_remote_server_key())

    def run(self, argv: Sequence[str], timeout: float | None = None, check: bool = False,
            stdin: bytes | None = None, prelude: Prelude | None = None) -> CommandResult:
        """Run argv (joined with shlex) on the host; as root, or via `sudo -n` (become: sudo)."""
        command = shlex.join(str(a) for a in argv)
        if prelude is not None:
            return self._exec(self._wrap(prelude.script + command), command, timeout, check, stdin, prelude)
        full = become_sudo(command) if self.needs_sudo else command
        return self._exec(full, command, timeout, check, stdin)

    def run_script(self, script: str, timeout: float | None = None, check: bool = False,
                   stdin: bytes | None = None, prelude: Prelude | None = None) -> CommandResult:
        """Run a shell script (its words already quoted with shlex.quote) under `sh -c`. A
        `prelude` runs first in the same shell; its `settle` reads the result before `check`."""
        text = prelude.script + script if prelude is not None else script
        return self._exec(self._wrap(text), script, timeout, check, stdin, prelude)

    def check_access(self) -> None:
        """With become: sudo, one `sudo -n true` before the first command: a user who may not
        use sudo, or whose sudo asks for a password, is refused in one line (exit 2)."""
        if not self.needs_sudo or self._access_ok:
            return
        began = time.monotonic()
        r = self._exec_inner(SUDO_PROBE, "sudo -n true", 30, False, None)
        _observe(self.name, "sudo -n true", began, f"rc={r.rc}")
        problem = sudo_problem(r.rc, r.stderr + r.stdout, self.host.user)
        if problem:
            h = self.host
            raise UserError(f"{h.name}: {self.reach.target.user}@{h.address} cannot act as root: {problem} "
                            f"(user:/become: in {h.inventory_path or 'the inventory'})")
        self._access_ok = True

    def _exec(self, full: str, shown: str, timeout, check, stdin, prelude: Prelude | None = None,
              limit: int | None = None) -> CommandResult:
        self.check_access()
        began = time.monotonic()
        try:
            result = self._exec_inner(full, shown, timeout, check, stdin, limit)
        except RemoteError as err:
            _observe(self.name, shown, began, f"error: {err}")
            raise
        _observe(self.name, shown, began, f"rc={result.rc}" + (" +prelude" if prelude is not None else ""))
        if prelude is not None:
            result = prelude.settle(result)      # raises when the prelude failed: nothing else ran
        if check and result.rc != 0:
            detail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or [""]
            raise RemoteError(f"{self.name}: `{short(shown)}` exited {result.rc}: {detail[0][:300]}")
        return result

    def _exec_inner(self, full: str, shown: str, timeout, check, stdin,
                    limit: int | None = None) -> CommandResult:
        timeout = self.host.command_timeout if timeout is None else timeout
        ssh = self.connect()
        try:
            chan = ssh.open_session(timeout=self.host.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise RemoteError(f"{self.name}: cannot open a session: {err}") from None
        ex = Exchange(chan, self.name, shown, timeout, limit)
        try:
            chan.settimeout(timeout)       # a dead link must not block exec_command forever
            chan.exec_command(full)
            ex.send(stdin)
            if ex.lost is not None:      # the command may have run on part of its input
                raise RemoteError(f"{self.name}: connection lost during {short(shown)}: {ex.lost}")
            ex.shutdown_write()          # its EOF alone lost: the exit status says whether the command ran
            rc = ex.finish()
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise RemoteError(f"{self.name}: connection lost during {short(shown)}: {e}") from None
        finally:
            close_quietly(chan)
        return CommandResult(shown, rc, ex.out.decode("utf-8", "replace"), ex.err.decode("utf-8", "replace"), bytes(ex.out))

    def open_exec(self, script: str, prelude: Prelude | None = None) -> Channel:
        """Start a long-lived command whose stdin is our channel (the deploy lock's holder, the
        readiness watch). The caller owns the channel; closing it (or this process dying) ends
        the command. A `prelude` runs first; the caller settles it from what the command prints."""
        self.check_access()
        began = time.monotonic()
        ssh = self.connect()
        try:
            chan = ssh.open_session(timeout=self.host.connect_timeout)
            chan.exec_command(self._wrap(prelude.script + script if prelude is not None else script))
        except (paramiko.SSHException, EOFError, OSError) as err:
            _observe(self.name, script, began, f"error: {err}")
            raise RemoteError(f"{self.name}: cannot start {short(script)}: {err}") from None
        _observe(self.name, script, began, "started (runs on)")
        return chan


def _give_up_on_dead_links(sock: socket.socket, connect_timeout: float) -> None:
    """A link that dies mid-command left paramiko waiting forever (exec_command waits for its
    reply with no timeout) until TCP gave up, ~15 min later. Data unacknowledged for this long
    now ends the connection, which wakes every waiter with an error; keepalive probes find a dead
    idle link the same way."""
    seconds = max(5, int(3 * connect_timeout))     # 30 s at the default connect_timeout (10 s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, seconds * 1000)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 15)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    except (AttributeError, OSError):      # not Linux: TCP's own timeouts apply
        pass


class TransportPool:
    """One Transport per host name, shared by every thread of a command; close_all() at exit."""

    def __init__(self, accept_new_host_key: bool = False):
        self.accept_new_host_key = accept_new_host_key
        self._lock = threading.Lock()
        self._transports: dict[str, Transport] = {}

    def get(self, host: Host) -> Transport:
        with self._lock:
            t = self._transports.get(host.name)
            if t is None or t.host != host:
                t = self._transports[host.name] = Transport(host, self.accept_new_host_key)
            return t

    def close_all(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            t.close()

    def __enter__(self) -> "TransportPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close_all()

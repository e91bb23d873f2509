"""The one place fleetspec talks SSH: commands, atomic file writes, and HTTP to the host's loopback.

One paramiko connection per host, reused by every call (channels are cheap, handshakes are not),
with TCP_NODELAY (Nagle cost ~40 ms per round trip). Host keys are checked against the
inventory's known_hosts: an unknown key is refused unless the policy is accept-new or the user
passed --accept-new-host-key (then it is recorded); a changed key is always refused. Only the
connect is retried — a command is never run twice.
"""

from __future__ import annotations

import json as jsonlib
import os
import re
import secrets
import select
import shlex
import socket
import threading
import time
from base64 import b64encode
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

import paramiko
import tenacity

from fleetspec.errors import RemoteError, UserError
from fleetspec.model.inventory import Host

_CHUNK = 65536

# Observers of every remote action (`-v/--verbose`): fn(host, what, seconds, outcome). The one hook
# sits here, in the one SSH place, so nothing fleetspec runs on a host escapes it.
_OBSERVERS: list = []
_SECRET_WORDS = re.compile(
    r"(?i)((?:--)?[A-Za-z0-9_-]*(?:api[_-]?key|token|secret|password|passwd)[A-Za-z0-9_]*[\"']?(?:=|\s+|:\s*))"
    r"(?:'[^']*'|\"[^\"]*\"|\S+)")


def add_observer(fn) -> None:
    """Call fn(host_name, shown_command, seconds, outcome) after each command or HTTP request."""
    _OBSERVERS.append(fn)


def remove_observer(fn) -> None:
    if fn in _OBSERVERS:
        _OBSERVERS.remove(fn)


def redact(text: str) -> str:
    """Values after secret-looking names (--api-key X, SGLANG_API_KEY=X, Authorization: …) hidden."""
    text = re.sub(r"(?i)(authorization:\s*)(?:bearer\s+|basic\s+)?[^\s'\"]+", r"\1***", text)
    return _SECRET_WORDS.sub(lambda m: m.group(1) + "***", text)


def _observe(host: str, what: str, began: float, outcome: str) -> None:
    if not _OBSERVERS:
        return
    seconds = time.monotonic() - began
    shown = redact(what)
    for fn in list(_OBSERVERS):
        try:
            fn(host, shown, seconds, outcome)
        except Exception:  # noqa: BLE001 - a broken observer must not break a deploy
            pass


@dataclass
class CommandResult:
    command: str
    rc: int
    stdout: str
    stderr: str
    stdout_bytes: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.body.decode("utf-8"))

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class HostKeyError(RemoteError):
    """A host key that is unknown (and not to be trusted) or changed; never retried."""


class _Retryable(Exception):
    """A connect failure worth another try (refused, reset, timed out before the handshake)."""


def fingerprint(key: paramiko.PKey) -> str:
    return "SHA256:" + b64encode(sha256(key.asbytes()).digest()).decode().rstrip("=")


def _known_hosts_lines(path: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if path.is_file():
        try:
            keys.load(str(path))
        except (OSError, paramiko.SSHException) as err:
            raise HostKeyError(f"cannot read known_hosts {path}: {err}") from None
    return keys


def check_host_key(label: str, name: str, key: paramiko.PKey, known_hosts: Path | None, accept_new: bool) -> None:
    """Refuse a changed key always; an unknown one unless accept_new (then record it)."""
    if known_hosts is None:
        raise HostKeyError(f"{label}: no known_hosts file configured in the inventory; refusing {name}")
    keys = _known_hosts_lines(known_hosts)
    entry = keys.lookup(name)
    if entry:
        known = entry.get(key.get_name())
        if known is not None and known.asbytes() == key.asbytes():
            return
        if known is not None or len(entry):
            raise HostKeyError(
                f"{label}: host key for {name} CHANGED (now {key.get_name()} {fingerprint(key)}), "
                f"not what {known_hosts} records; refusing to connect")
    if not accept_new:
        raise HostKeyError(
            f"{label}: unknown host key for {name} ({key.get_name()} {fingerprint(key)}) not in {known_hosts}; "
            f"use host_key_policy: accept-new or --accept-new-host-key to trust it")
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _KH_LOCK:
        fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


_KH_LOCK = threading.Lock()


def _load_keys(host: Host) -> list[paramiko.PKey]:
    """The inventory's key; without one, the agent's keys then ~/.ssh/id_* (as ssh would)."""
    if host.ssh_key is not None:
        try:
            return [paramiko.PKey.from_path(host.ssh_key)]
        except (OSError, paramiko.SSHException, ValueError) as err:
            raise RemoteError(f"{host.name}: cannot load ssh key {host.ssh_key}: {err}") from None
    keys: list[paramiko.PKey] = list(paramiko.Agent().get_keys())
    for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
        p = Path.home() / ".ssh" / name
        if p.is_file():
            try:
                keys.append(paramiko.PKey.from_path(p))
            except (paramiko.SSHException, ValueError, OSError):
                continue
    return keys


class Transport:
    """SSH to one host (see module docstring); thread-safe for concurrent commands."""

    def __init__(self, host: Host, accept_new_host_key: bool = False):
        self.host = host
        self.accept_new = accept_new_host_key or host.host_key_policy == "accept-new"
        self._lock = threading.Lock()
        self._ssh: paramiko.Transport | None = None
        self._jump: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._access_ok = False

    # ---- connection ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.host.name

    def connect(self) -> paramiko.Transport:
        with self._lock:
            if self._ssh is not None and self._ssh.is_active():
                return self._ssh
            self._close_locked()
            deadline = time.monotonic() + self.host.connect_timeout
            retry = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(_Retryable),
                stop=tenacity.stop_before_delay(self.host.connect_timeout),
                wait=tenacity.wait_exponential(multiplier=0.2, max=2),
                reraise=True)
            try:
                self._ssh = retry(self._connect_once, deadline)
            except _Retryable as err:
                raise RemoteError(f"{self.name}: cannot reach {self.host.address}:{self.host.port}"
                                  f"{' via ' + str(self.host.jump) if self.host.jump else ''}: {err}") from None
            return self._ssh

    def _connect_once(self, deadline: float) -> paramiko.Transport:
        h = self.host
        remaining = max(0.1, deadline - time.monotonic())
        if h.jump is not None:
            sock = self._jump_channel(remaining)
        else:
            try:
                sock = socket.create_connection((h.address, h.port), timeout=remaining)
            except socket.gaierror as err:  # a name that does not resolve will not start to
                raise RemoteError(f"{self.name}: cannot resolve {h.address}: {err.strerror or err}") from None
            except (ConnectionError, socket.timeout, TimeoutError, OSError) as err:
                raise _Retryable(str(err) or type(err).__name__) from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _give_up_on_dead_links(sock, h.connect_timeout)
        return self._handshake(sock, h.address, h.port, h.user, deadline, h.known_hosts_name)

    def _jump_channel(self, timeout: float):
        h, j = self.host, self.host.jump
        if self._jump is None or not self._jump.is_active():
            try:
                sock = socket.create_connection((j.address, j.port), timeout=timeout)
            except socket.gaierror as err:
                raise RemoteError(f"{self.name}: cannot resolve jump host {j.address}: {err.strerror or err}") from None
            except OSError as err:
                raise _Retryable(f"jump {j}: {err}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _give_up_on_dead_links(sock, h.connect_timeout)
            name = j.address if j.port == 22 else f"[{j.address}]:{j.port}"
            self._jump = self._handshake(sock, j.address, j.port, j.user or h.user,
                                         time.monotonic() + timeout, name)
        try:
            return self._jump.open_channel("direct-tcpip", (h.address, h.port), ("127.0.0.1", 0), timeout=timeout)
        except (paramiko.ChannelException, paramiko.SSHException, OSError) as err:
            raise _Retryable(f"via jump {j}: {err}") from None

    def _handshake(self, sock, address, port, user, deadline, kh_name) -> paramiko.Transport:
        t = paramiko.Transport(sock)
        try:
            t.banner_timeout = t.auth_timeout = max(1.0, deadline - time.monotonic())
            try:
                t.start_client(timeout=max(1.0, deadline - time.monotonic()))
            except (paramiko.SSHException, EOFError, OSError) as err:
                raise _Retryable(f"SSH handshake with {address}:{port} failed: {err}") from None
            check_host_key(self.name, kh_name, t.get_remote_server_key(), self.host.known_hosts, self.accept_new)
            errors = []
            for key in _load_keys(self.host):
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
                raise RemoteError(f"{self.name}: {user}@{address}:{port} refused our key"
                                  f"{' (' + str(self.host.ssh_key) + ')' if self.host.ssh_key else ''}")
            t.set_keepalive(30)
            return t
        except BaseException:
            t.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        for thing in (self._sftp, self._ssh, self._jump):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
        self._sftp = self._ssh = self._jump = None

    # ---- commands --------------------------------------------------------------------------

    @property
    def needs_sudo(self) -> bool:
        return self.host.become == "sudo"

    def _wrap(self, script: str) -> str:
        return become_sudo(script) if self.needs_sudo else f"sh -c {shlex.quote(script)}"

    def run(self, argv: Sequence[str], timeout: float | None = None, check: bool = False,
            stdin: bytes | None = None) -> CommandResult:
        """Run argv (joined with shlex) on the host; as root, or via `sudo -n` (become: sudo)."""
        command = shlex.join(str(a) for a in argv)
        full = become_sudo(command) if self.needs_sudo else command
        return self._exec(full, command, timeout, check, stdin)

    def run_script(self, script: str, timeout: float | None = None, check: bool = False,
                   stdin: bytes | None = None) -> CommandResult:
        """Run a shell script (its words already quoted with shlex.quote) under `sh -c`."""
        return self._exec(self._wrap(script), script, timeout, check, stdin)

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
            raise UserError(f"{h.name}: {h.user}@{h.address} cannot act as root: {problem} "
                            f"(user:/become: in {h.inventory_path or 'the inventory'})")
        self._access_ok = True

    def _exec(self, full: str, shown: str, timeout, check, stdin) -> CommandResult:
        self.check_access()
        began = time.monotonic()
        try:
            result = self._exec_inner(full, shown, timeout, check, stdin)
        except RemoteError as err:
            _observe(self.name, shown, began, f"error: {err}")
            raise
        _observe(self.name, shown, began, f"rc={result.rc}")
        if check and result.rc != 0:
            detail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or [""]
            raise RemoteError(f"{self.name}: `{_short(shown)}` exited {result.rc}: {detail[0][:300]}")
        return result

    def _exec_inner(self, full: str, shown: str, timeout, check, stdin) -> CommandResult:
        timeout = self.host.command_timeout if timeout is None else timeout
        ssh = self.connect()
        try:
            chan = ssh.open_session(timeout=self.host.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise RemoteError(f"{self.name}: cannot open a session: {err}") from None
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            chan.settimeout(timeout)       # a dead link must not block a stdin write forever
            chan.exec_command(full)
            if stdin is not None:
                view = memoryview(stdin)
                while view:
                    sent = chan.send(view[:_CHUNK])
                    view = view[sent:]
            chan.shutdown_write()
            exited_at = None
            while True:
                if chan.recv_ready():
                    out += chan.recv(_CHUNK)
                    continue
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(_CHUNK)
                    continue
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    # sshd may send the exit status before the last of the output: read on to EOF
                    # (a child left running in the background may hold the pipe: then 5 s at most).
                    if chan.eof_received or chan.closed:
                        break
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at > 5:
                        break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteError(f"{self.name}: command timed out after {timeout:g}s: {_short(shown)}")
                select.select([chan], [], [], min(left, 0.25))
            # Drain anything that arrived with the exit status.
            while chan.recv_ready():
                out += chan.recv(_CHUNK)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(_CHUNK)
            rc = chan.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise RemoteError(f"{self.name}: connection lost during {_short(shown)}: {e}") from None
        finally:
            chan.close()
        return CommandResult(shown, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), bytes(out))

    def open_exec(self, script: str):
        """Start a long-lived command whose stdin is our channel (the deploy lock's holder).
        The caller owns the channel; closing it (or this process dying) ends the command."""
        self.check_access()
        began = time.monotonic()
        ssh = self.connect()
        try:
            chan = ssh.open_session(timeout=self.host.connect_timeout)
            chan.exec_command(self._wrap(script))
        except (paramiko.SSHException, EOFError, OSError) as err:
            _observe(self.name, script, began, f"error: {err}")
            raise RemoteError(f"{self.name}: cannot start {_short(script)}: {err}") from None
        _observe(self.name, script, began, "started (runs on)")
        return chan

    # ---- files -----------------------------------------------------------------------------

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
        return float(min(self.host.command_timeout, 60))

    def _drop_sftp(self) -> None:
        with self._lock:
            sftp, self._sftp = self._sftp, None
        if sftp is not None:
            try:
                sftp.close()
            except Exception:  # noqa: BLE001 - closing is best effort
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
        if self.needs_sudo:
            script = (f"umask 077; cat > {q(tmp)} && chmod {mode:o} {q(tmp)} && {rename} "
                      f"|| {{ rc=$?; rm -f {q(tmp)}; exit $rc; }}")
            self.run_script(script, check=True, stdin=data)
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
            r = self.run_script(f"{rename} || {{ rc=$?; rm -f -- {q(tmp)}; exit $rc; }}", timeout=self.io_timeout)
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
        if self.needs_sudo:
            return self.run(["cat", "--", path], check=True).stdout_bytes
        sftp = self._sftp_client()
        try:
            with sftp.open(path, "rb") as f:
                f.prefetch()
                return f.read()
        except FileNotFoundError:
            raise RemoteError(f"{self.name}: {path}: no such file") from None
        except (OSError, paramiko.SSHException) as err:
            if isinstance(err, (socket.timeout, TimeoutError)):
                self._drop_sftp()
                raise RemoteError(f"{self.name}: connection lost while reading {path}: no progress for "
                                  f"{self.io_timeout:g}s") from None
            raise RemoteError(f"{self.name}: cannot read {path}: {err}") from None

    # ---- HTTP over the SSH connection --------------------------------------------------------

    def http(self, method: str, port: int, path: str, json: Any = None, timeout: float = 5,
             headers: dict[str, str] | None = None) -> HttpResponse:
        """A minimal HTTP/1.1 request to 127.0.0.1:<port> on the host, through a direct-tcpip channel."""
        for k, v in (headers or {}).items():
            if any(c in f"{k}{v}" for c in "\r\n\0") or not k or ":" in k:
                # a CR/LF in a header value (an API key from the environment) would add headers or a request
                raise UserError(f"{self.name}: HTTP header {k!r} holds a CR, LF or NUL (or a bad name); "
                                f"refusing to send it (check the variable it comes from)")
        began = time.monotonic()
        what = f"{method.upper()} http://127.0.0.1:{port}{path}"
        try:
            response = self._http_inner(method, port, path, json, timeout, headers)
        except RemoteError as err:
            _observe(self.name, what, began, f"error: {str(err).removeprefix(self.name + ': ')}")
            raise
        _observe(self.name, what, began, f"HTTP {response.status}")
        return response

    def _http_inner(self, method, port, path, json, timeout, headers) -> HttpResponse:
        ssh = self.connect()
        body = b"" if json is None else jsonlib.dumps(json).encode()
        lines = [f"{method.upper()} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
                 "Accept: application/json", "User-Agent: fleetspec"]
        if json is not None:
            lines.append("Content-Type: application/json")
        if body or method.upper() in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        where = f"{self.name}: http://127.0.0.1:{port}{path}"
        try:
            chan = ssh.open_channel("direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as err:
            raise RemoteError(f"{where}: connection refused ({err.text})") from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise RemoteError(f"{where}: {err or 'channel open timed out'}") from None
        deadline = time.monotonic() + timeout
        raw = bytearray()
        try:
            chan.settimeout(timeout)
            chan.sendall(request)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteError(f"{where}: no complete answer within {timeout:g}s")
                chan.settimeout(left)
                chunk = chan.recv(_CHUNK)
                if not chunk:
                    break
                raw += chunk
        except socket.timeout:
            raise RemoteError(f"{where}: no complete answer within {timeout:g}s") from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            raise RemoteError(f"{where}: {err}") from None
        finally:
            chan.close()
        return _parse_http(bytes(raw), where)


def _parse_http(raw: bytes, where: str) -> HttpResponse:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise RemoteError(f"{where}: truncated HTTP answer ({len(raw)} bytes)")
    lines = head.decode("iso-8859-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise RemoteError(f"{where}: not an HTTP answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(body, where)
    elif "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return HttpResponse(int(parts[1]), headers, body)


def _dechunk(data: bytes, where: str) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.find(b"\r\n", i)
        if j < 0:
            raise RemoteError(f"{where}: truncated chunked body")
        size = int(data[i:j].split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return bytes(out)
        out += data[j + 2:j + 2 + size]
        i = j + 2 + size + 2


def _give_up_on_dead_links(sock: socket.socket, connect_timeout: float) -> None:
    """A link that dies mid-command left paramiko waiting forever (exec_command waits for its
    reply with no timeout) until TCP gave up, ~15 min later. Data unacknowledged for this long
    now ends the connection, which wakes every waiter with an error; keepalive probes find a dead
    idle link the same way."""
    seconds = max(30, int(3 * connect_timeout))
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, seconds * 1000)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 15)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    except (AttributeError, OSError):      # not Linux: TCP's own timeouts apply
        pass


# Root's umask over sshd, so that what sudo writes is moded as what root writes (sudo would
# otherwise apply the user's umask, e.g. 027, to every folder and file fleetspec makes).
SUDO_UMASK = "022"
SUDO_PROBE = "sudo -n -- true"
_SUDO_FIX = "fleetspec runs `sudo -n` and never types a password"


def become_sudo(command: str) -> str:
    """A shell command run as root through `sudo -n` (fails, never prompts, when a password is needed)."""
    return f"sudo -n -- sh -c {shlex.quote(f'umask {SUDO_UMASK}; {command}')}"


def sudo_problem(rc: int, output: str, user: str) -> str | None:
    """What `sudo -n true` answered, as the operator's fix; None when it worked."""
    if rc == 0:
        return None
    text = " ".join(output.split())
    said = f" (sudo said: {text[:160]})" if text else ""
    if rc == 127 or "not found" in text:
        return "sudo is not installed on the host; install it or connect as root"
    if "password is required" in text:
        # sudo answers the same for a user with no rule at all: it asks before it looks at the rules
        return (f"sudo asks for a password{said}: the user has no NOPASSWD rule (or no sudo rule at all) and "
                f"{_SUDO_FIX}; give it a NOPASSWD sudoers rule "
                f"(e.g. `{user} ALL=(root) NOPASSWD: ALL` in /etc/sudoers.d/) or connect as root")
    if "tty" in text:
        return f"its sudo needs a terminal (requiretty){said}; allow it without one or connect as root"
    return (f"the user may not use sudo{said}; give it a NOPASSWD sudoers rule "
            f"(e.g. `{user} ALL=(root) NOPASSWD: ALL` in /etc/sudoers.d/) or connect as root")


def _short(command: str, n: int = 120) -> str:
    command = " ".join(command.split())
    return command if len(command) <= n else command[: n - 1] + "…"


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

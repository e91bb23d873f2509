"""Shared fixtures: real OpenSSH servers on 127.0.0.1 (each its own host key), a client key, and
inventories that point at them.

`sshd` is one session-wide server; `sshd_factory()` starts more (a fake fleet). Servers run as
children of the test process (`/usr/sbin/sshd -D -e`) and are stopped by their pid.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleetspec-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return path


@dataclass
class Sshd:
    """One sshd on 127.0.0.1:port with its own host key, trusting the session's client key."""

    workdir: Path
    port: int
    client_key: Path
    proc: subprocess.Popen | None = None
    host_key: Path = field(init=False)

    def __post_init__(self):
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host_key = self.workdir / "ssh_host_ed25519_key"
        if not self.host_key.exists():
            keygen(self.host_key)
        (self.workdir / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        (self.workdir / "sshd_config").write_text(textwrap.dedent(f"""\
            Port {self.port}
            ListenAddress 127.0.0.1
            HostKey {self.host_key}
            PidFile {self.workdir}/sshd.pid
            AuthorizedKeysFile {self.workdir}/authorized_keys
            StrictModes no
            PubkeyAuthentication yes
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            PermitRootLogin prohibit-password
            UsePAM no
            AllowTcpForwarding yes
            MaxSessions 64
            MaxStartups 64
            LogLevel ERROR
            Subsystem sftp internal-sftp
            """))

    @property
    def known_hosts_line(self) -> str:
        pub = Path(f"{self.host_key}.pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n"

    def start(self) -> "Sshd":
        if self.proc is not None and self.proc.poll() is None:
            return self
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        log = open(self.workdir / "sshd.log", "ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.workdir / "sshd_config")],
                                     stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 60     # its listen is awaited; a loaded machine only delays it
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.workdir / 'sshd.log').read_text()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5):
                    return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("sshd did not start listening")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def ssh_client_key(tmp_path_factory) -> Path:
    return keygen(tmp_path_factory.mktemp("client") / "id_ed25519")


@pytest.fixture(scope="session")
def sshd_factory(tmp_path_factory, ssh_client_key):
    """Call it to start another sshd (a host of a fake fleet); all are stopped at session end."""
    if not os.path.exists(SSHD):
        pytest.skip("openssh-server is not installed")
    started: list[Sshd] = []

    def make() -> Sshd:
        server = Sshd(tmp_path_factory.mktemp("sshd"), free_port(), ssh_client_key).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def sshd(sshd_factory) -> Sshd:
    return sshd_factory()


def write_inventory(path: Path, servers: dict[str, Sshd], client_key: Path, known_hosts: Path | None = None,
                    *, policy: str = "strict", connect_timeout: float = 3, command_timeout: float = 30,
                    host_vars: dict | None = None, trust: bool = True) -> Path:
    """An inventory of loopback sshds; `trust` writes their host keys into known_hosts first."""
    known_hosts = known_hosts or path.parent / "known_hosts"
    if trust:
        known_hosts.write_text("".join(s.known_hosts_line for s in servers.values()))
    lines = [
        "defaults:",
        "  user: root",
        f"  ssh_key: {client_key}",
        f"  known_hosts: {known_hosts}",
        f"  host_key_policy: {policy}",
        f"  connect_timeout: {connect_timeout}",
        f"  command_timeout: {command_timeout}",
        f"  vars: {{python: {sys.executable}, service: sglang-test.service, api_port: 30000}}",
        "hosts:",
    ]
    for name, server in servers.items():
        lines.append(f"  {name}: {{address: 127.0.0.1, port: {server.port}}}")
        if host_vars and name in host_vars:
            lines[-1] = lines[-1][:-1] + f", vars: {host_vars[name]}}}"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def t(tmp_path, sshd, ssh_client_key, inventory_writer):
    """A Transport to the loopback sshd as host `h` (what the remote-layer unit tests drive)."""
    from fleetspec.model.inventory import load_inventory
    from fleetspec.remote.transport import Transport

    host = load_inventory(inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key)).hosts["h"]
    transport = Transport(host)
    yield transport
    transport.close()


@pytest.fixture(scope="session")
def inventory_writer():
    """The write_inventory helper, for tests that build inventories of loopback sshds."""
    return write_inventory


# A skip for a missing prerequisite (sshd, a cached wheel, torch, root, nspawn) hides a broken
# set-up; under CI (`CI` set, as .ci/run has it) it counts as a failure instead.
_PREREQUISITE_SKIPS = ("not installed", "not cached", "no wheel cache", "need root", "lab tests need",
                       "could not import", "not registered")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not os.environ.get("CI") or not report.skipped or call.excinfo is None:
        return
    reason = str(call.excinfo.value)
    if any(word in reason for word in _PREREQUISITE_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"CI set, but a prerequisite is missing (the set-up should have installed it): {reason}"


@pytest.fixture
def seen():
    """Every remote command run while the test runs (transport.add_observer), in order."""
    from fleetspec.remote import transport

    got = []
    observer = lambda host, what, seconds, outcome: got.append(what)
    transport.add_observer(observer)
    yield got
    transport.remove_observer(observer)


LAUNCH = ("/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3.6-27B "
          "--speculative-algo NEXTN --speculative-num-steps 3")


class _Sglang(http.server.BaseHTTPRequestHandler):
    """/health and /server_info of an engine serving NEXTN (read back as EAGLE), as sglang answers."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/health":
            body = b""
        elif self.path == "/server_info":
            body = json.dumps({"speculative_algorithm": "EAGLE", "launch_command": LAUNCH, "version": "0.5.23"}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def fake_sglang():
    """The port of a stand-in engine on 127.0.0.1 (a host's api_port, reached through its SSH link)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sglang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()

"""systemd on a host: the few systemctl, journalctl and systemd-analyze calls a deploy makes.

`ops/` says when a unit is reloaded, restarted or read; the command lines live here, each word
through shlex.quote. Reading a unit goes through the systemd fact, so there is one parser.

Restarts are watched in one `systemctl show` per look: `systemctl restart` returns 0 even for a
unit that crashes, and NRestarts only grows after RestartSec once the crash is over. The main
process's own start and exit timestamps say at once that the process started by our restart has
exited: `restart` notes ExecMainStartTimestampMonotonic before it restarts (in the same command),
and `exited` compares.
"""

from __future__ import annotations

import base64
import select
import shlex
import time
from dataclasses import dataclass

from fleetspec.errors import RemoteError
from fleetspec.remote import facts, files
from fleetspec.remote.api import CommandResult, TransportLike
from fleetspec.remote.exchange import close_quietly, drain
from fleetspec.remote.facts import systemd as systemd_fact

q = shlex.quote
DAEMON_RELOAD = "systemctl daemon-reload"


def show(t: TransportLike, service: str) -> systemd_fact.SystemdUnit:
    """The unit as systemd holds it now (facts.systemd), in one round trip."""
    return facts.gather(t, systemd_fact, timeout=30, service=service)


def daemon_reload(t: TransportLike) -> None:
    t.run_script(DAEMON_RELOAD, timeout=120, check=True)


# What a message tells an operator to run (fleetspec never runs these): built here with the rest of
# systemd's command lines, each word quoted, so ops/ writes no shell of its own.
def on_host_command(address: str, command: str) -> str:
    """`ssh ADDRESS 'COMMAND'`: `command` run on the host from the operator's shell."""
    return f"ssh {q(address)} {q(command)}"


def status_command(service: str) -> str:
    return f"systemctl status {q(service)}"


def journal_command(service: str, lines: int = 50) -> str:
    return f"journalctl -u {q(service)} -n {int(lines)}"


def remove_dropin_command(dropin: str, service: str) -> str:
    """Drop a drop-in and start the unit without it."""
    return f"rm {q(dropin)} && {DAEMON_RELOAD} && systemctl restart {q(service)}"


def journal_tail(t: TransportLike, service: str, lines: int = 20) -> list[str]:
    """The unit's last `lines` journal lines (evidence for a failed probe; empty when unreadable)."""
    r = t.run_script(f"journalctl --unit={q(service)} -n {int(lines)} --no-pager -o cat 2>&1", timeout=30, check=False)
    return r.stdout.strip().splitlines()[-lines:]


WATCH = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainCode", "ExecMainStatus",
         "ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")
_CLD_CODES = {"1": "exited", "2": "killed", "3": "dumped"}   # ExecMainCode: the CLD_* of waitid()


@dataclass(frozen=True)
class UnitWatch:
    active_state: str | None = None
    sub_state: str | None = None
    result: str | None = None
    n_restarts: int | None = None
    main_code: str | None = None
    main_status: int | None = None
    main_start_us: int = 0
    main_exit_us: int = 0

    def describe(self) -> str:
        how = _CLD_CODES.get(self.main_code or "", self.main_code or "?")
        return (f"ActiveState={self.active_state}, SubState={self.sub_state}, Result={self.result}, "
                f"main process {how} with status {self.main_status}, NRestarts={self.n_restarts}")


@dataclass(frozen=True)
class Restarted:
    """The unit's state just before our restart: what a later look is compared with."""
    n_restarts: int | None
    main_start_us: int


def show_command(service: str) -> str:
    return f"systemctl show -p {','.join(WATCH)} -- {shlex.quote(service)}"


def parse_watch(stdout: str) -> UnitWatch:
    raw = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in WATCH:
            raw[key] = value.strip()
    return UnitWatch(active_state=raw.get("ActiveState") or None, sub_state=raw.get("SubState") or None,
                     result=raw.get("Result") or None, n_restarts=_int(raw.get("NRestarts")),
                     main_code=raw.get("ExecMainCode") or None, main_status=_int(raw.get("ExecMainStatus")),
                     main_start_us=_int(raw.get("ExecMainStartTimestampMonotonic")) or 0,
                     main_exit_us=_int(raw.get("ExecMainExitTimestampMonotonic")) or 0)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "[not set]") else None
    except ValueError:
        return None


def look(t: TransportLike, service: str) -> UnitWatch:
    return parse_watch(t.run_script(show_command(service), timeout=30, check=True).stdout)


WATCH_EVERY_S = 0.5
_TICK = "."


BEFORE = "FLEETSPEC-BEFORE-RESTART"


def watch_script(service: str, deadline_s: float, show: str | None = None, restart: str | None = None) -> str:
    """A host-side loop for the readiness wait: every WATCH_EVERY_S, `systemctl show` of WATCH as
    one tab-separated line when it changed, else a bare "." (a closed channel then ends the loop
    with SIGPIPE within one tick); it ends by itself after `deadline_s` either way. `show`: the
    command that prints the state (the unit tests' stand-in for systemctl). `restart` (a shell
    command, restart_command's): first print the state as a BEFORE line, then run it, then the loop."""
    show = show or show_command(service)
    first = ""
    if restart is not None:
        first = (f"before=$({show}) || exit 1; printf '%s %s\\n' {BEFORE} \"$(printf %s \"$before\" | tr '\\n' '\\t')\"; "
                 f"{restart} >&2; ")
    return (first + f"end=$(( $(date +%s) + {int(deadline_s) + 1} )); last=; "
            f"while [ \"$(date +%s)\" -lt \"$end\" ]; do "
            f"now=$({show} | tr '\\n' '\\t') || exit 1; "
            f"if [ \"$now\" != \"$last\" ]; then printf '%s\\n' \"$now\" || exit 0; last=$now; "
            f"else echo {_TICK} || exit 0; fi; sleep {WATCH_EVERY_S}; done")


def parse_watch_line(line: str) -> UnitWatch | None:
    """One line of watch_script (None for a tick)."""
    line = line.strip()
    return parse_watch(line.replace("\t", "\n")) if "=" in line else None


class UnitStream:
    """The unit's state as watch_script streams it, over one long-lived command: `latest()` reads
    what arrived without waiting for the host. A prelude (ops/hoststate.py) runs before the loop;
    it is settled by the first line (the loop only starts once it succeeded) or by the end."""

    def __init__(self, t: TransportLike, service: str, deadline_s: float, prelude=None, show: str | None = None,
                 restart: str | None = None):
        script = watch_script(service, deadline_s, show, restart)
        self.chan = t.open_exec(script, prelude=prelude) if prelude is not None else t.open_exec(script)
        self.prelude, self.ended = prelude, False
        self.state: UnitWatch | None = None
        self.restarted: Restarted | None = None       # the BEFORE line's state (restart=)
        self._buf, self._err = b"", b""

    def latest(self, wait: float = 0.0) -> UnitWatch | None:
        """The newest state seen (waiting up to `wait` s for a first one); None once the loop has
        ended (the caller then looks with one `systemctl show`, as before the stream)."""
        until = time.monotonic() + wait
        while True:
            self._drain()
            if self.ended:
                return None
            if self.state is not None or time.monotonic() >= until:
                return self.state
            select.select([self.chan], [], [], max(0.0, min(0.1, until - time.monotonic())))

    def before(self, timeout: float = 120) -> Restarted:
        """The state printed before the restart (restart=), once it arrived: the restart is issued
        right after it. RemoteError when the command ended first (its prelude's failure raises
        from _settle) or printed nothing in `timeout` s."""
        until = time.monotonic() + timeout
        while self.restarted is None:
            self._drain()
            if self.ended or time.monotonic() >= until:
                detail = self._err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
                raise RemoteError(f"restarting the unit: the watch {'ended' if self.ended else 'printed nothing'} "
                                  f"before its first line: {detail[0][:300]}")
            select.select([self.chan], [], [], 0.1)
        return self.restarted

    def watch(self, seconds: float, stop) -> UnitWatch | None:
        """Read for up to `seconds`, returning at once the first new state for which `stop` holds."""
        until = time.monotonic() + seconds
        while not self.ended:
            seen = self.state
            self._drain()
            if self.state is not seen and self.state is not None and stop(self.state):
                return self.state
            left = until - time.monotonic()
            if left <= 0:
                break
            select.select([self.chan], [], [], min(left, 0.25))
        return None

    def _drain(self) -> None:
        out, err = drain(self.chan)
        self._buf += out
        self._err += err
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            self._settle(0)
            text = raw.decode("utf-8", "replace")
            if text.startswith(BEFORE + " "):
                before = parse_watch_line(text.removeprefix(BEFORE + " "))
                self.restarted = Restarted(before.n_restarts, before.main_start_us) if before else Restarted(None, 0)
                continue
            unit = parse_watch_line(text)
            if unit is not None:
                self.state = unit
        if self.chan.exit_status_ready() and not self.chan.recv_ready():
            self.ended = True
            self._settle(self.chan.recv_exit_status())

    def _settle(self, rc: int) -> None:
        if self.prelude is not None:
            prelude, self.prelude = self.prelude, None
            prelude.settle(CommandResult("readiness watch", rc, "", self._err.decode("utf-8", "replace")))

    def close(self) -> None:
        close_quietly(self.chan)


def restart_command(service: str) -> str:
    """Clear a failed state and queue the restart (--no-block); its exit status is not trusted."""
    unit = shlex.quote(service)
    return f"{{ systemctl reset-failed -- {unit} 2>/dev/null; systemctl restart --no-block -- {unit} || true; }}"


def restart(t: TransportLike, service: str) -> Restarted:
    """One command: note the state, clear a failed state, queue the restart (--no-block: the
    readiness wait watches it come up instead of `systemctl` waiting on a start that may hang;
    its exit status is not trusted either way, a crashing unit's restart returns 0)."""
    r = t.run_script(f"{show_command(service)} && {restart_command(service)}", timeout=120, check=True)
    before = parse_watch(r.stdout)
    return Restarted(before.n_restarts, before.main_start_us)


def started_since(unit: UnitWatch, since: Restarted | None) -> bool:
    """True once the unit's main process is a new one, started after `since` (our restart):
    until then the process answering on the port may be the old one, still serving or draining,
    and its /ready or /health says nothing about the release (`restart --no-block` only queues
    the job). No restart of ours to compare with: whatever runs is the one to probe."""
    return since is None or unit.main_start_us > since.main_start_us


def exited(unit: UnitWatch, since: Restarted | None) -> bool:
    """True when the unit can no longer become ready without another start: it failed, systemd
    restarted it since `since`, or the main process started after `since` exited or waits for
    its automatic restart. A state from before our restart (the old process stopping, a crash
    loop's auto-restart the restart job has not replaced yet) is not taken for the new one's."""
    if unit.active_state == "failed":
        return True
    if since is None:
        return unit.sub_state == "auto-restart"
    if since.n_restarts is not None and unit.n_restarts is not None and unit.n_restarts > since.n_restarts:
        return True
    if unit.main_start_us <= since.main_start_us:
        return False
    return unit.main_exit_us >= unit.main_start_us or unit.sub_state == "auto-restart"


NO_ANALYZE = "__FLEETSPEC_NO_SYSTEMD_ANALYZE__"


def verify_script(rundir: str, service: str, unit_bytes: bytes, dropin_name: str, dropin: bytes) -> str:
    """One command: `systemd-analyze verify` of the unit with a drop-in, on a scratch copy in a
    fresh unguessable folder inside the root-only `rundir` (removed on exit; a fixed name in a shared
    folder could be made first by anyone, with `<svc>.d` a symlink to where root then writes);
    prints NO_ANALYZE where the host has no systemd-analyze. Its exit status and output are verify's."""
    def enc(data: bytes) -> str:
        return f"printf %s {q(base64.b64encode(data).decode())} | base64 -d"

    return verify_from_script(rundir, service, enc(unit_bytes), dropin_name, enc(dropin))


def verify_from_script(rundir: str, service: str, unit_from: str, dropin_name: str, dropin_from: str) -> str:
    """verify_script with the unit's and the drop-in's bytes printed by two shell commands
    (`unit_from`, `dropin_from`: built with shlex.quote), e.g. read from stdin or a file just written."""
    unit = f'"$s"/{q(service)}'
    return "\n".join([
        f"command -v systemd-analyze >/dev/null || {{ echo {NO_ANALYZE}; exit 0; }}",
        f"s=$({files.scratch_dir(rundir)}) || exit 1",
        "trap 'rm -rf -- \"$s\"' EXIT",
        "umask 077",
        f"mkdir -m 0700 -- {unit}.d",
        f"{unit_from} > {unit}",
        f"{dropin_from} > {unit}.d/{q(dropin_name)}",
        f"SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no -- {unit}",
    ])


def analyze_verify(t: TransportLike, rundir: str, service: str, unit_bytes: bytes, dropin_name: str,
                   dropin: bytes) -> CommandResult | None:
    """verify_script run on the host; None where it has no systemd-analyze."""
    r = t.run_script(verify_script(rundir, service, unit_bytes, dropin_name, dropin), timeout=60, check=False)
    return None if r.stdout.strip() == NO_ANALYZE else r


WRITTEN = "__FLEETSPEC_WRITTEN__"


@dataclass(frozen=True)
class WriteAndVerify:
    verify: CommandResult | None      # systemd-analyze verify's result; None where the host has none
    sha256: dict[str, str]            # of the `hash_paths` that existed, as read before the writes


def write_and_verify(t: TransportLike, writes: list[tuple[str, bytes, int]], sync: list[str], rundir: str,
                     service: str, unit_bytes: bytes, dropin_name: str, dropin_path: str,
                     hash_paths: tuple[str, ...] = ()) -> WriteAndVerify:
    """The render step in one command, every byte on stdin (none on the command line): hash
    `hash_paths`, write each (path, bytes, mode) atomically (files.write_from_stdin), fsync `sync`,
    then verify_from with the unit from stdin and the drop-in as written at `dropin_path`.
    A write that fails raises RemoteError and verify does not run."""
    steps = " && ".join(files.write_from_stdin(path, data, mode) for path, data, mode in writes)
    script = "\n".join([
        "umask 077",
        files.sha256_of(sorted(hash_paths)),
        f"{{ {steps} && {files.fsync(*sync)}; }} || exit 1",
        f"echo {WRITTEN}",
        "(", verify_from_script(rundir, service, f"head -c {len(unit_bytes)}", dropin_name, f"cat -- {q(dropin_path)}"),
        ")",
    ])
    stdin = b"".join(data for _, data, _ in writes) + unit_bytes
    r = t.run_script(script, timeout=60, check=False, stdin=stdin)
    split = split_written(r.stdout)
    if split is None:
        detail = (r.stderr.strip() or r.stdout.strip() or f"exit {r.rc}").splitlines()[-1][:300]
        raise RemoteError(f"{getattr(t, 'name', 'host')}: writing {', '.join(p for p, _, _ in writes)} failed: {detail}")
    before, after = split
    verify = None if after.strip() == NO_ANALYZE else CommandResult(r.command, r.rc, after, r.stderr)
    return WriteAndVerify(verify, files.parse_sha256sum(before))


def split_written(stdout: str) -> tuple[str, str] | None:
    """write_and_verify's output: (what came before the WRITTEN line, verify's output after it);
    None when the line is missing (the writes failed)."""
    head, sep, tail = stdout.partition(WRITTEN + "\n")
    return (head, tail) if sep else None

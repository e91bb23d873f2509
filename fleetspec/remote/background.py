"""A process on the host that outlives the SSH command that starts it (the smoke runner, started
as soon as a release is staged and read just before the switch).

Its folder (root-only, 0700) holds `in` (its stdin), `out`, `err`, `rc` (written when it ends)
and `pid`: the process-group leader, a `timeout` that kills the whole group when its time is up,
so a controller that dies never leaves it running for good. `stop` kills that group only when
the recorded pid still runs this folder's command (a reused pid is left alone)."""

from __future__ import annotations

from dataclasses import dataclass
from shlex import quote as q

from fleetspec.errors import FleetspecError
from fleetspec.remote.api import TransportLike

MARK = "FLEETSPEC-BG-RC "
NO_RC = "none"


@dataclass
class Verdict:
    rc: int | None          # None: the process ended without writing its exit code (killed, timed out)
    stdout: str
    stderr: str


def start_script(folder: str, command: str, *, timeout_s: int, nice: int = 10, on_success: str = "") -> str:
    """Shell that makes `folder` afresh, saves stdin as its `in`, starts `command` (a shell string)
    detached in its own session at lower CPU priority, and returns once its pid is recorded.
    `started` gets the second it started; `on_success` (shell) runs after an exit 0, before `rc`."""
    f = folder.rstrip("/")
    then = f"if [ $rc -eq 0 ]; then {on_success}; fi; " if on_success else ""
    body = (f"date +%s >{q(f + '/started')}; {command} <{q(f + '/in')} >{q(f + '/out')} 2>{q(f + '/err')}; "
            f"rc=$?; {then}echo $rc >{q(f + '/rc.tmp')} && mv -f -- {q(f + '/rc.tmp')} {q(f + '/rc')}")
    return (f"umask 077 && rm -rf -- {q(f)} && mkdir -m 0700 -- {q(f)} && cat >{q(f + '/in')} && "
            f"{{ setsid nice -n {int(nice)} timeout -k 5 {int(timeout_s)} sh -c {q(body)} "
            f"</dev/null >/dev/null 2>&1 & echo $! >{q(f + '/pid')}; }}")


def start(t: TransportLike, folder: str, command: str, *, stdin: bytes, timeout_s: int, nice: int = 10) -> None:
    r = t.run_script(start_script(folder, command, timeout_s=timeout_s, nice=nice), timeout=60, check=False,
                     stdin=stdin)
    if r.rc != 0:
        raise FleetspecError(f"could not start a background process in {folder}: "
                             f"{(r.stderr.strip().splitlines() or [f'exit {r.rc}'])[-1]}")


def _alive(f: str) -> str:
    """True while the recorded pid runs this folder's command."""
    return (f"{{ pid=$(cat {q(f + '/pid')} 2>/dev/null) && [ -n \"$pid\" ] && "
            f"grep -qF -- {q(f + '/')} /proc/\"$pid\"/cmdline 2>/dev/null; }}")


def wait_script(folder: str) -> str:
    """Block until the process ends; print MARK + its exit code (or `none`), then its stdout; its
    stderr goes to stderr."""
    f = folder.rstrip("/")
    return (f"while [ ! -e {q(f + '/rc')} ] && {_alive(f)}; do sleep 0.05; done; "
            f"printf '%s%s\\n' {q(MARK)} \"$(cat {q(f + '/rc')} 2>/dev/null || echo {NO_RC})\"; "
            f"cat -- {q(f + '/out')} 2>/dev/null; cat -- {q(f + '/err')} >&2 2>/dev/null; true")


def wait(t: TransportLike, folder: str, *, timeout: float) -> Verdict:
    r = t.run_script(wait_script(folder), timeout=timeout, check=True)
    head, _, rest = r.stdout.partition("\n")
    if not head.startswith(MARK):
        raise FleetspecError(f"could not read the background process in {folder}: {head[:200]!r}")
    code = head[len(MARK):].strip()
    return Verdict(None if code == NO_RC or not code.lstrip("-").isdigit() else int(code), rest, r.stderr)


def stop_script(folder: str) -> str:
    """Kill the process group if (and only if) it still runs this folder's command."""
    f = folder.rstrip("/")
    return f"if {_alive(f)}; then kill -9 -\"$pid\" 2>/dev/null; echo stopped; fi; true"


def stop(t: TransportLike, folder: str) -> bool:
    """True when a running process was killed."""
    return "stopped" in t.run_script(stop_script(folder), timeout=30, check=True).stdout

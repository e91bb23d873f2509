"""Restarting a unit and watching it come up, in one `systemctl show` per look.

`systemctl restart` returns 0 even for a unit that crashes, and NRestarts only grows after
RestartSec (5 s and more on real hosts) once the crash is over. The main process's own start and
exit timestamps say at once that the process started by our restart has exited: `restart` notes
ExecMainStartTimestampMonotonic before it restarts (in the same command), and `exited` compares.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

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


def look(t, service: str) -> UnitWatch:
    return parse_watch(t.run_script(show_command(service), timeout=30, check=True).stdout)


def restart(t, service: str) -> Restarted:
    """One command: note the state, clear a failed state, queue the restart (--no-block: the
    readiness wait watches it come up instead of `systemctl` waiting on a start that may hang;
    its exit status is not trusted either way, a crashing unit's restart returns 0)."""
    unit = shlex.quote(service)
    r = t.run_script(f"{show_command(service)} && {{ systemctl reset-failed -- {unit} 2>/dev/null; "
                     f"systemctl restart --no-block -- {unit} || true; }}", timeout=120, check=True)
    before = parse_watch(r.stdout)
    return Restarted(before.n_restarts, before.main_start_us)


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
    fresh unguessable folder inside the root-only `rundir` (removed on exit); prints NO_ANALYZE
    where the host has no systemd-analyze. Its exit status and output are verify's."""
    import base64

    from fleetspec.remote import files

    unit = f'"$s"/{shlex.quote(service)}'
    enc = lambda data: base64.b64encode(data).decode()  # noqa: E731
    return "\n".join([
        f"command -v systemd-analyze >/dev/null || {{ echo {NO_ANALYZE}; exit 0; }}",
        f"s=$({files.scratch_dir(rundir)}) || exit 1",
        "trap 'rm -rf -- \"$s\"' EXIT",
        "umask 077",
        f"mkdir -m 0700 -- {unit}.d",
        f"printf %s {shlex.quote(enc(unit_bytes))} | base64 -d > {unit}",
        f"printf %s {shlex.quote(enc(dropin))} | base64 -d > {unit}.d/{shlex.quote(dropin_name)}",
        f"SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no -- {unit}",
    ])

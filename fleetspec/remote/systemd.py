"""systemd on a host: the few systemctl, journalctl and systemd-analyze calls a deploy makes.

`ops/` says when a unit is reloaded, restarted or read; the command lines live here, each word
through shlex.quote. Reading a unit goes through the systemd fact, so there is one parser.
"""

from __future__ import annotations

import shlex

from fleetspec.remote import facts
from fleetspec.remote.facts import systemd as systemd_fact
from fleetspec.remote.api import CommandResult, TransportLike

q = shlex.quote
DAEMON_RELOAD = "systemctl daemon-reload"


def show(t: TransportLike, service: str) -> systemd_fact.SystemdUnit:
    """The unit as systemd holds it now (facts.systemd), in one round trip."""
    return facts.gather(t, systemd_fact, timeout=30, service=service)


def daemon_reload(t: TransportLike) -> None:
    t.run_script(DAEMON_RELOAD, timeout=120, check=True)


def queue_restart(t: TransportLike, service: str) -> None:
    """reset-failed, then a restart that does not wait: readiness is proved by probes, since
    `systemctl restart` returns 0 even for a unit that crashes."""
    t.run_script(f"systemctl reset-failed -- {q(service)} 2>/dev/null; systemctl restart --no-block -- {q(service)}",
                 timeout=120, check=False)


def journal_tail(t: TransportLike, service: str, lines: int = 20) -> list[str]:
    """The unit's last `lines` journal lines (evidence for a failed probe; empty when unreadable)."""
    r = t.run_script(f"journalctl --unit={q(service)} -n {int(lines)} --no-pager -o cat 2>&1", timeout=30, check=False)
    return r.stdout.strip().splitlines()[-lines:]


def analyze_available(t: TransportLike) -> bool:
    return t.run_script("command -v systemd-analyze >/dev/null", timeout=30, check=False).rc == 0


def analyze_verify(t: TransportLike, unit_path: str) -> CommandResult:
    """`systemd-analyze verify` on a unit file (its `.d/` folder beside it is read too)."""
    return t.run_script(f"SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no -- {q(unit_path)}",
                        timeout=60, check=False)

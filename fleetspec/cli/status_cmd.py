"""`fleetspec status [HOST…|@group|--all] [--json]`: the fleet at a glance."""

from __future__ import annotations

import json
import sys

import click

from fleetspec.cli.completion import complete_targets
from fleetspec.cli.output import echo

STYLES = {"ok": "green", "active": "green", "active/running": "green", "pristine": "green", "healthy": "green",
          "down": "red", "failed": "red", "unreachable": "red", "unhealthy": "red", "loading": "yellow",
          "activating": "yellow", "activating/start": "yellow"}


@click.command()
@click.argument("targets", nargs=-1, shell_complete=complete_targets)
@click.option("--all", "all_hosts", is_flag=True, help="Every host in the inventory (the default).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host per line.")
@click.option("--workers", type=click.IntRange(1, 256), default=16, show_default=True,
              help="Hosts queried at the same time.")
@click.option("--watch", is_flag=True,
              help="Refresh until every host's health is ok (exit 0) or --deadline passes "
                   "(exit 4: a host unreachable or still loading; exit 3: a host down or unhealthy).")
@click.option("--deadline", type=click.FloatRange(min=0), default=900, show_default=True,
              help="Seconds --watch waits at most.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between --watch rounds.")
@click.pass_obj
def status(obj, targets, all_hosts, as_json, workers, watch, deadline, interval):
    """Reachability, service state, algorithm, sglang version, GPU problems, release, drift and
    health per host. The gpu column is ok, - (no nvidia-smi) or what preflight would refuse on
    (ECC, pending remap, Xid, foreign process), with one note per GPU and cause.

    Health is ok (/health 200), loading (the unit is starting or running and the port does not
    answer yet, within the host's ready timeout), down (the unit failed or is inactive, or the
    port still does not answer past the ready timeout) or unhealthy (answering, /health not 200).
    Exit 4 when a host is unreachable, 3 when one is down or unhealthy, else 0.
    """
    from fleetspec.ops.status import exit_code, fleet_status
    from fleetspec.ops.status import watch as do_watch

    hosts = obj.select(targets, all_hosts, default_all=True)
    if not watch:
        rows = fleet_status(obj.pool, hosts, workers=workers)
        _emit(rows, as_json)
        sys.exit(exit_code(rows))
    tty = sys.stdout.isatty() and not as_json

    def on_round(rows, elapsed):
        if as_json:
            return
        if tty:
            from rich.console import Console

            Console().clear()
            echo(f"fleetspec status --watch: {elapsed:.0f}s of {deadline:.0f}s")
            _table(rows)
        else:
            echo(f"[{elapsed:5.1f}s] " + ", ".join(f"{r.host} {r.health if r.reachable else 'unreachable'}"
                                                   for r in rows))

    result = do_watch(obj.pool, hosts, deadline, interval=interval, workers=workers, on_round=on_round)
    if as_json:
        _emit(result.rows, True)
    elif not tty:
        _table(result.rows)
    if result.all_ok:
        echo(f"all {len(result.rows)} hosts ok after {result.seconds:.0f}s", err=True)
    else:
        waiting = [f"{r.host} ({r.health if r.reachable else 'unreachable'})" for r in result.rows
                   if not (r.reachable and r.health == "ok")]
        echo(f"fleetspec: deadline {deadline:.0f}s passed; not ok: {', '.join(waiting)}", err=True)
    sys.exit(result.exit_code)


def _emit(rows, as_json: bool) -> None:
    if as_json:
        for row in rows:
            echo(json.dumps(row.to_json(), sort_keys=True))
    else:
        _table(rows)


HEADERS = ("host", "health", "state", "algo", "sglang", "gpu", "release", "drift", "service")


def _cells(r) -> list[str]:
    if not r.reachable:
        return [r.host, "unreachable", "-", "-", "-", "-", "-", "-", r.service]
    release = f"{r.release} ({r.release_status or '?'})" if r.release else "-"
    return [r.host, r.health or "-", r.state or "-", r.algo or "-", r.sglang or "-", r.gpu or "-", release,
            r.drift or "-", r.service]


def _table(rows) -> None:
    """One line per host when the terminal is wide enough (drift wraps at spaces), else the
    short facts on one line and release, drift and service wrapped beneath. Nothing is cut."""
    from fleetspec.cli.output import Out, wrap

    out = Out()
    table = [_cells(r) for r in rows]
    fixed = [max(len(h), *(len(c[i]) for c in table)) for i, h in enumerate(HEADERS)]
    drift_i = HEADERS.index("drift")
    order = [i for i in range(len(HEADERS)) if i != drift_i] + [drift_i]    # drift last: it may wrap
    room = out.width - sum(fixed[i] + 2 for i in order[:-1])
    notes = []
    if room >= min(fixed[drift_i], 24):
        head = "".join(HEADERS[i].ljust(fixed[i] + 2) for i in order[:-1])
        out.line(head + HEADERS[drift_i], [(0, len(head) + 5, "bold")])
        for cells in table:
            line = "".join(cells[i].ljust(fixed[i] + 2) for i in order[:-1])
            drift = wrap(cells[drift_i], room)
            spans = _spans(line, cells, [(i, sum(fixed[j] + 2 for j in order[:order.index(i)])) for i in (1, 2)])
            out.line(line + drift[0], spans)
            for extra in drift[1:]:
                out.line(" " * len(line) + extra)
    else:
        for cells in table:
            line = "  ".join(cells[:5])
            out.line(line, _spans(line, cells, [(1, len(cells[0]) + 2), (2, len(cells[0]) + len(cells[1]) + 4)]))
            rest = f"gpu {cells[5]}; release {cells[6]}; drift {cells[7]}; service {cells[8]}"
            for ln in wrap(rest, out.width, "    ", "  "):
                out.line(ln)
    for r in rows:
        notes += [_note(r.host, r.error)] if not r.reachable else [_note(r.host, n) for n in r.notes]
    for n in notes:
        for ln in wrap(n, out.width, "    ", ""):
            out.line(ln, [(0, len(ln), "dim")])


def _spans(line: str, cells: list[str], where) -> list:
    out = []
    for i, start in where:
        style = STYLES.get(cells[i])
        if style:
            out.append((start, start + len(cells[i]), style))
    return out


def _note(host: str, text: str) -> str:
    return text if text.startswith(f"{host}:") else f"{host}: {text}"


COMMANDS = [status]

"""`fleetspec status [HOST…|@group|--all] [--json]`: the fleet at a glance."""

from __future__ import annotations

import json
import sys

import click

from fleetspec.cli.completion import complete_targets

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
                   "(exit 4: some still loading; exit 1: some down, unhealthy or unreachable).")
@click.option("--deadline", type=click.FloatRange(min=0), default=900, show_default=True,
              help="Seconds --watch waits at most.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between --watch rounds.")
@click.pass_obj
def status(obj, targets, all_hosts, as_json, workers, watch, deadline, interval):
    """Reachability, service state, algorithm, sglang version, release, drift and health per host.

    Health is ok (/health 200), loading (the unit is starting or running and the port does not
    answer yet, within the host's ready timeout), down (the unit failed or is inactive, or the
    port still does not answer past the ready timeout) or unhealthy (answering, /health not 200).
    """
    from fleetspec.ops.status import fleet_status, watch as do_watch

    hosts = obj.select(targets, all_hosts, default_all=True)
    if not watch:
        rows = fleet_status(obj.pool, hosts, workers=workers)
        _emit(rows, as_json)
        return
    tty = sys.stdout.isatty() and not as_json

    def on_round(rows, elapsed):
        if as_json:
            return
        if tty:
            from rich.console import Console

            Console().clear()
            click.echo(f"fleetspec status --watch: {elapsed:.0f}s of {deadline:.0f}s")
            _table(rows)
        else:
            click.echo(f"[{elapsed:5.1f}s] " + ", ".join(f"{r.host} {r.health if r.reachable else 'unreachable'}"
                                                         for r in rows))

    result = do_watch(obj.pool, hosts, deadline, interval=interval, workers=workers, on_round=on_round)
    if as_json:
        _emit(result.rows, True)
    elif not tty:
        _table(result.rows)
    if result.all_ok:
        click.echo(f"all {len(result.rows)} hosts ok after {result.seconds:.0f}s", err=True)
    else:
        waiting = [f"{r.host} ({r.health if r.reachable else 'unreachable'})" for r in result.rows
                   if not (r.reachable and r.health == "ok")]
        click.echo(f"fleetspec: deadline {deadline:.0f}s passed; not ok: {', '.join(waiting)}", err=True)
    sys.exit(result.exit_code)


def _emit(rows, as_json: bool) -> None:
    if as_json:
        for row in rows:
            click.echo(json.dumps(row.to_json(), sort_keys=True))
    else:
        _table(rows)


def _cell(value) -> str:
    if value is None:
        return "-"
    style = STYLES.get(str(value))
    return f"[{style}]{value}[/{style}]" if style else str(value)


def _table(rows) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.markup import escape

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("host", "reachable", "service", "state", "algo", "sglang", "release", "drift", "health"):
        table.add_column(col)
    notes = []
    for r in rows:
        if not r.reachable:
            table.add_row(r.host, _cell("unreachable"), r.service, "-", "-", "-", "-", "-", "-")
            notes.append(_note(r.host, r.error))
            continue
        release = f"{r.release} ({r.release_status or '?'})" if r.release else "-"
        table.add_row(r.host, "yes", r.service, _cell(r.state), _cell(r.algo), _cell(r.sglang), escape(release),
                      _cell(r.drift), _cell(r.health))
        notes.extend(_note(r.host, n) for n in r.notes)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 200))  # logs and pipes: never cut a cell
    console.print(table)
    for n in notes:
        console.print(escape(n), style="dim", highlight=False)


def _note(host: str, text: str) -> str:
    return text if text.startswith(f"{host}:") else f"{host}: {text}"


COMMANDS = [status]

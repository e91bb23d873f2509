"""`fleetspec status [HOST…|@group|--all] [--json]`: the fleet at a glance."""

from __future__ import annotations

import json

import click

STYLES = {"ok": "green", "active": "green", "active/running": "green", "pristine": "green", "healthy": "green",
          "down": "red", "failed": "red", "unreachable": "red"}


@click.command()
@click.argument("targets", nargs=-1)
@click.option("--all", "all_hosts", is_flag=True, help="Every host in the inventory (the default).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host per line.")
@click.option("--workers", type=click.IntRange(1, 256), default=16, show_default=True,
              help="Hosts queried at the same time.")
@click.pass_obj
def status(obj, targets, all_hosts, as_json, workers):
    """Reachability, service state, algorithm, sglang version, release, drift and health per host."""
    from fleetspec.ops.status import fleet_status

    hosts = obj.select(targets, all_hosts, default_all=True)
    rows = fleet_status(obj.pool, hosts, workers=workers)
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

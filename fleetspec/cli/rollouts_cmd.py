"""rollouts, promote, abort: a fleet deploy or rollback as one thing with an id (ops/rollouts.py).

Layout only: the records are read and written in ops/rollouts.py; one rollout's story per host
is the timeline `history` draws (cli/timeline.py), from the lines that carry its id in the
fleet root's ledger mirror (the controller that ran the rollout wrote every one of them there).
"""

from __future__ import annotations

import json
import sys
import time

import click

from fleetspec.cli.output import Out, Progress, echo, echo_table
from fleetspec.cli.timeline import secs, spans_of, timeline


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts)) if ts else "-"


def _state(record, live: bool) -> str:
    """`running` whose lock is free: its process is gone (cut off)."""
    return "cut off" if record.state == "running" and not live else record.state


def _live(root, rid: str) -> bool:
    from fleetspec.errors import UserError
    from fleetspec.ops.rollouts import held

    try:
        with held(root, rid, "reading"):
            return False
    except UserError:
        return True


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per rollout (its whole record).")
@click.option("--limit", type=int, default=20, show_default=True, help="The last N rollouts.")
@click.pass_context
def rollouts(ctx, as_json, limit):
    """The fleet's rollouts, newest last: id, what ran, state, when, hosts ok of all, batches run.
    Every deploy and rollback that changes hosts is one; its id is in each host's ledger lines.

    \b
    Example: fleetspec rollouts show 20261205-001526-3af1
    """
    if ctx.invoked_subcommand is not None:
        return
    from fleetspec.ops.rollouts import all_records

    root = ctx.obj.root_path
    records, bad = all_records(root)
    for line in bad:
        echo(f"warning: {line}", err=True)
    records = records[-limit:] if limit > 0 else records
    if as_json:
        for r in records:
            echo(json.dumps({**r.to_json(), "state": _state(r, _live(root, r.id))}, sort_keys=True))
        return
    if not records:
        echo("no rollouts yet")
        return
    rows = []
    for r in records:
        ok = sum(1 for h in r.hosts.values() if h.status in ("healthy", "rolled_back"))
        what = f"deploy {r.algo}" if r.kind == "deploy" else f"rollback {r.to}"
        began = time.strftime("%m-%d %H:%M", time.gmtime(r.created))
        rows.append([r.id, what, _state(r, _live(root, r.id)), began, f"{ok}/{len(r.host_order())}",
                     f"{r.next_batch}/{len(r.batches)}"])
    echo_table(["rollout", "what", "state", "began (UTC)", "ok", "batches"], rows)


@rollouts.command("show")
@click.argument("rollout_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="The record as it is stored.")
@click.pass_obj
def show(obj, rollout_id, as_json):
    """One rollout's story: who ran what, its batches, each host's outcome, gate figures and
    timings, then each host's steps as the timeline `history` draws, from the lines with its id.

    \b
    Example: fleetspec rollouts show 3af1
    """
    from fleetspec.ops import rollouts as ops

    root = obj.root_path
    record = ops.load(root, ops.find(root, rollout_id))
    live = _live(root, record.id)
    if as_json:
        echo(json.dumps({**record.to_json(), "state": _state(record, live)}, sort_keys=True))
        return
    out = Out()
    out.line(f"rollout {record.id}: {record.kind} "
             f"{record.algo if record.kind == 'deploy' else 'to ' + str(record.to)}, {_state(record, live)}",
             [(0, 7, "bold")])
    out.line(f"  by {record.by}, began {_when(record.created)}")
    out.line(f"  command: {' '.join(record.command)}")
    s = record.strategy
    out.line(f"  batches: {' | '.join(', '.join(b) for b in record.batches)}  (canary {s.get('canary', 0)}, "
             f"max-fail {s.get('max_fail', 0)}, failed so far {record.failures}"
             + (f", pauses after {record.pause_after}" if record.pause_after else "") + ")")
    for e in record.events:
        out.line(f"  {_when(e.get('ts'))}  {e.get('what')}  ({e.get('by')})")
    _host_table(record)
    _timelines(obj, record, out)
    if record.state == "paused":
        echo(f"next: fleetspec promote {record.id}   (or: fleetspec abort {record.id})")


def _host_table(record) -> None:
    from fleetspec.ops.history import headline

    rows = []
    for name in record.host_order():
        h = record.hosts.get(name)
        if h is None:
            rows.append([name, "-", "pending", "-", "-", "-", "-", ""])
            continue
        rows.append([name, str(h.batch + 1), h.status, h.release or "-", h.previous or "-", secs(h.seconds),
                     "; ".join(headline(h.figures)) or "-", h.reason])
    echo("")
    echo_table(["host", "batch", "outcome", "release", "before", "took", "gate figures", "why"], rows)


def _timelines(obj, record, out: Out) -> None:
    """Each host's steps in this rollout, from the fleet root's ledger mirror (no host is asked)."""
    from fleetspec.errors import FleetspecError
    from fleetspec.model import ledger as L
    from fleetspec.model.layout import local_mirror
    from fleetspec.ops.history import of_rollout

    try:
        by_name = {h.name: h for h in obj.inv.select([], all_hosts=True)}
    except FleetspecError as err:
        echo(f"warning: no timelines: {err}", err=True)
        return
    for name in record.host_order():
        h = by_name.get(name)
        mirror = local_mirror(obj.root_path, h, h.vars.service) / "ledger.jsonl" if h is not None else None
        if mirror is None or not mirror.is_file():
            continue
        for r in of_rollout(L.parse(mirror.read_text(errors="replace")), record.id):
            bars = timeline(spans_of(r.steps), min(out.width, 80), r.ended)
            out.line()
            out.line(f"{name}: {r.id} {r.status}", [(0, len(name) + 1, "bold")])
            for ln in bars:
                out.line(ln)


def _select(obj):
    return lambda names: obj.select(names, False)


@click.command()
@click.argument("rollout_id", metavar="ID")
@click.option("--yes", is_flag=True, help="Do not ask before changing hosts.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host this promote ran.")
@click.pass_obj
def promote(obj, rollout_id, yes, as_json):
    """Go on with a paused rollout, from any shell on this controller: its next batches with the
    same playbook, options, max-fail budget and pause points (all from its record), to the end
    or its next pause. One promote of a rollout at a time.

    \b
    Example: fleetspec promote 20261205-001526-3af1
    """
    import os

    from fleetspec.cli.deploy_cmd import _print_deploy_summary, _say_rollout_next
    from fleetspec.ops import drain, rollouts

    root = obj.root_path
    rid = rollouts.find(root, rollout_id)
    rollouts.promotable(rollouts.load(root, rid))
    if not yes and sys.stdin.isatty():
        click.confirm(f"Promote rollout {rid}?", abort=True)
    progress = Progress(enabled=not as_json)
    record, outcomes = rollouts.promote(root, rid, select=_select(obj), connect=obj.transport, echo=progress.echo,
                                        progress=progress.line, seats_of=lambda hosts: drain.seats(obj.inv, hosts),
                                        pause_at=os.environ.get("FLEETSPEC_PAUSE_AT"))
    progress.line(None)
    if as_json:
        for o in outcomes:
            echo(json.dumps({**o.to_json(), "rollout": rid}, default=str, sort_keys=True))
    else:
        _print_deploy_summary(outcomes)
        _say_rollout_next(record)
    sys.exit(max((o.exit_code for o in outcomes), default=0))


@click.command()
@click.argument("rollout_id", metavar="ID")
@click.option("--yes", is_flag=True, help="Do not ask before changing hosts.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host put back.")
@click.pass_obj
def abort(obj, rollout_id, yes, as_json):
    """Put back the hosts a rollout left on its release, each to what it ran before the rollout
    (its previous release or its baseline), and record it; its later batches never run.

    \b
    Example: fleetspec abort 20261205-001526-3af1
    """
    from fleetspec.ops import drain, rollouts

    root = obj.root_path
    rid = rollouts.find(root, rollout_id)
    if not yes and sys.stdin.isatty():
        click.confirm(f"Abort rollout {rid} and roll back {', '.join(rollouts.load(root, rid).changed()) or 'nothing'}?",
                      abort=True)
    progress = Progress(enabled=not as_json)
    rows, code = rollouts.abort(root, rid, select=_select(obj), connect=obj.transport, echo=progress.echo,
                                progress=progress.line, seats_of=lambda hosts: drain.seats(obj.inv, hosts))
    progress.line(None)
    if as_json:
        for r in rows:
            echo(json.dumps({**r, "rollout": rid}, default=str, sort_keys=True))
    else:
        echo_table(["host", "outcome", "from", "to", "time", "note"],
                   [[r["host"], r["status"], r.get("left") or "baseline" if r["status"] == "rolled_back" else "-",
                     r.get("target", "-"), f"{r.get('seconds', 0):.1f}s", r.get("note") or r.get("reason", "")]
                    for r in rows] or [["-", "nothing to roll back", "-", "-", "-", ""]])
        echo(f"rollout {rid}: fleetspec rollouts show {rid}")
    sys.exit(code)


COMMANDS = [rollouts, promote, abort]

"""deploy, rollback, history, unlock, baseline: the commands that change (or explain) a host."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys

import click

from fleetspec.cli.completion import complete_algos, complete_hosts, complete_releases, complete_targets
from fleetspec.cli.output import Progress, echo, echo_table
from fleetspec.model.gpuhealth import CHECKS as GPU_CHECKS


@click.command()
@click.argument("targets", nargs=-1, shell_complete=complete_targets)
@click.option("--all", "all_hosts", is_flag=True, help="Every host in the inventory.")
@click.option("--algo", required=True, shell_complete=complete_algos, help="Playbook to apply: nextn, dflash, ddtree, …")
@click.option("--plan", "plan_only", is_flag=True, help="Show what would change; change nothing.")
@click.option("--mode", type=click.Choice(["release", "in-place"]), default="release", show_default=True)
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE", help="Override a playbook option.")
@click.option("--no-gates", is_flag=True, help="Skip the playbook's gates (probes still run).")
@click.option("--allow-unhealthy", is_flag=True,
              help="Deploy onto an engine that is down or unhealthy, to replace it (needs --no-gates: there is no "
                   "baseline to measure). Without it such a host is refused; one still loading is waited for.")
@click.option("--canary", type=int, default=0, show_default=True, help="Hosts to move first, alone.")
@click.option("--serial", default="1", show_default=True, help="Hosts per batch after the canary (N or P%).")
@click.option("--max-fail", default="0", show_default=True, help="Failures tolerated fleet-wide (K or P%).")
@click.option("--parallel", type=int, default=0, help="Hosts at once within a batch (default: the batch size).")
@click.option("--rollback-all-on-abort", is_flag=True, help="On abort, also roll back hosts moved in this run.")
@click.option("--prestage", is_flag=True,
              help="While the first batch deploys, stage the release on the later batches' hosts (nothing live changes).")
@click.option("--stage-only", is_flag=True,
              help="Stage the release and run its smoke tests on every host, then stop (nothing live changes): "
                   "the next deploy of this algo switches to it, sending nothing.")
@click.option("--pause-after", type=click.Choice(["canary", "each-batch"]), default=None,
              help="Stop there with every host so far healthy and committed (exit 0): `fleetspec promote ID` "
                   "goes on, `fleetspec abort ID` puts them back.")
@click.option("--waive-gpu", "waive_gpu", multiple=True, type=click.Choice(list(GPU_CHECKS)), metavar="CHECK",
              help=f"Let one GPU health check pass (repeatable): {', '.join(GPU_CHECKS)}.")
@click.option("--yes", is_flag=True, help="Do not ask before changing hosts.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host.")
@click.pass_obj
def deploy(obj, targets, all_hosts, algo, plan_only, mode, sets, no_gates, allow_unhealthy, canary, serial, max_fail,
           parallel, rollback_all_on_abort, prestage, stage_only, pause_after, waive_gpu, yes, as_json):
    """Move hosts to an algo: preflight, lock, baseline, stage (the smoke tests start in the
    background), render, measure, smoke (their verdict), switch, restart, probes, gates, commit.
    Any failure after the switch reverts the host (exit 1). --stage-only ends after the smoke
    verdict, nothing live changed (`deploy @gpu --algo ddtree --stage-only`); the next deploy
    of that algo switches to the staged release.

    \b
    Each deploy is a rollout with an id (`fleetspec rollouts`); --pause-after waits for `promote`.

    \b
    Example: fleetspec deploy @gpu --algo ddtree --canary 1 --serial 25% --max-fail 0
    """
    from fleetspec.model.overrides import parse_overrides
    from fleetspec.model.playbook import load_playbook_for
    from fleetspec.ops import drain, fleet
    from fleetspec.ops.smoke_run import smoke_nice

    smoke_nice()                          # a bad $FLEETSPEC_SMOKE_NICE is refused before any host is touched
    if allow_unhealthy and not no_gates and not plan_only:
        from fleetspec.errors import UserError

        raise UserError("--allow-unhealthy needs --no-gates: the gates compare the release with the engine's figures "
                        "before the switch, and an engine that does not serve has none")
    if stage_only:
        _refuse_with_stage_only(plan=plan_only, prestage=prestage, canary=canary,
                                rollback_all_on_abort=rollback_all_on_abort, pause_after=pause_after)
    _refuse_pause_without_canary(pause_after, canary)
    hosts = obj.select(targets, all_hosts)      # --all with named hosts is refused there
    playbook = load_playbook_for(obj.root_path, algo)
    if waive_gpu:                         # for this run, as if the playbook's gpu_health.waive listed them
        playbook = dataclasses.replace(playbook, gpu_waive=tuple(dict.fromkeys([*playbook.gpu_waive, *waive_gpu])))
    options = parse_overrides(playbook, sets)
    strategy = fleet.Strategy.parse(len(hosts), canary=canary, serial=serial, max_fail=max_fail,
                                    parallel=parallel, rollback_all_on_abort=rollback_all_on_abort,
                                    prestage=prestage)
    if not plan_only and not stage_only and not yes and sys.stdin.isatty():
        click.confirm(f"Deploy {algo} to {', '.join(h.name for h in hosts)} (inventory {obj.inventory_path})?",
                      abort=True)
    progress = Progress(enabled=not as_json)
    record = None
    if stage_only:                        # nothing live changes: no question asked
        outcomes = fleet.stage_fleet(hosts, playbook, connect=obj.transport, root=obj.root_path, options=options,
                                     parallel=parallel, mode=mode, echo=progress.echo)
    elif plan_only:
        outcomes = fleet.deploy_fleet(hosts, playbook, connect=obj.transport, root=obj.root_path, options=options,
                                      strategy=strategy, plan_only=plan_only, mode=mode, run_gates=not no_gates,
                                      echo=progress.echo, progress=progress.line, allow_unhealthy=allow_unhealthy,
                                      pause_at=os.environ.get("FLEETSPEC_PAUSE_AT"),
                                      seats=drain.seats(obj.inv, hosts))
    else:
        record, outcomes = _run_rollout(obj, hosts, playbook, options, strategy, progress, as_json, algo=algo,
                                        sets=sets, waive_gpu=waive_gpu, mode=mode, run_gates=not no_gates,
                                        allow_unhealthy=allow_unhealthy, pause_after=pause_after)
    progress.line(None)
    _report(outcomes, record, as_json=as_json, plan_only=plan_only, algo=algo, inventory=obj.inventory_path)
    sys.exit(max((o.exit_code for o in outcomes), default=0))


def _run_rollout(obj, hosts, playbook, options, strategy, progress, as_json, **fields):
    """A deploy that changes hosts: its rollout record first, then its batches (ops/rollouts.py)."""
    from fleetspec.ops import drain, rollouts

    record = _new_rollout(obj, hosts, playbook, strategy, **fields)
    outcomes = rollouts.run_deploy(obj.root_path, record, hosts, playbook, connect=obj.transport, options=options,
                                   strategy=strategy, echo=progress.echo, progress=progress.line,
                                   seats=drain.seats(obj.inv, hosts), mode=fields["mode"],
                                   run_gates=fields["run_gates"], allow_unhealthy=fields["allow_unhealthy"],
                                   pause_at=os.environ.get("FLEETSPEC_PAUSE_AT"))
    return record, outcomes


def _report(outcomes, record, *, as_json: bool, plan_only: bool, algo: str, inventory) -> None:
    """JSON lines, the plans (naming the inventory they come from) or the summary table and what
    the rollout can do next."""
    rid = record.id if record is not None else None
    if as_json:
        for o in outcomes:
            row = {**o.to_json(), **({"rollout": rid} if rid else {})}
            echo(json.dumps({**row, "inventory": str(inventory)} if plan_only else row, default=str, sort_keys=True))
    elif plan_only:
        echo(f"inventory: {inventory}")
        for o in outcomes:
            _print_plan(o)
    else:
        _print_deploy_summary(outcomes)
        # a rollout refused on every host (bad input) changed nothing: only its one-line refusal
        if record is not None and any(str(o.status) != "refused" for o in outcomes):
            _say_rollout_next(record)
    staged = [o.host for o in outcomes if o.status == "staged"]
    if staged and not as_json:
        echo(f"next: fleetspec deploy {' '.join(staged)} --algo {algo} switches to the staged release "
             "(nothing sent, its smoke verdict kept)")


def _new_rollout(obj, hosts, playbook, strategy, **fields):
    """The rollout's record, written before any host is touched (its id goes in every ledger line)."""
    import hashlib

    from fleetspec.ops import rollouts

    record = rollouts.new_record("deploy", [[h.name for h in b] for b in strategy.batches(hosts)],
                                 ["fleetspec", *sys.argv[1:]], strategy=dataclasses.asdict(strategy),
                                 playbook_sha256=hashlib.sha256(playbook.path.read_bytes()).hexdigest(),
                                 **{**fields, "sets": list(fields["sets"]), "waive_gpu": list(fields["waive_gpu"])})
    return rollouts.create(obj.root_path, record)


def _say_rollout_next(record) -> None:
    """How to go on from a pause, or where the story is."""
    if record.state == "paused":
        done = sum(len(b) for b in record.batches[:record.next_batch])
        echo(f"rollout {record.id} paused after batch {record.next_batch} of {len(record.batches)}: {done} host(s) "
             f"healthy and committed, {len(record.host_order()) - done} waiting.")
        echo(f"next: fleetspec promote {record.id}   (or: fleetspec abort {record.id} puts them back)")
    else:
        echo(f"rollout {record.id} {record.state}: fleetspec rollouts show {record.id}")


def _refuse_pause_without_canary(pause_after, canary) -> None:
    if pause_after == "canary" and not canary:
        from fleetspec.errors import UserError

        raise UserError("--pause-after canary needs --canary N: there is no canary batch to stop after")


def _refuse_with_stage_only(**given) -> None:
    """--stage-only stops before the switch: an option about switching is a mistake, said at once."""
    from fleetspec.errors import UserError

    for name, value in given.items():
        if value:
            raise UserError(f"--stage-only cannot be combined with --{name.replace('_', '-')}: it stages and "
                            "smoke-tests, and switches nothing")


def _print_plan(o) -> None:
    if o.plan is None:
        echo(f"{o.host}: {o.status}: {o.reason}")
        return
    p = o.plan.to_dict()
    echo(f"== {p['host']} ({p['service']}, sglang {p['sglang']}): {p['previous']} -> {p['algo']} "
         f"(serves {p['expected_algorithm']})")
    for note in p["notes"]:
        echo(f"   note: {note}")
    launch = p.get("launch")
    if launch:
        echo(f"-- ExecStart form: {launch['form']}" + (f" (prefix {launch['prefix']})" if launch["prefix"] else "")
             + f"; algorithm as written: {launch['baseline_algorithm'] or 'none'}")
        for label, key in (("kept", "kept"), ("dropped", "dropped"), ("carried", "carried")):
            words = " ".join(shlex.join(item) for item in launch[key])
            echo(f"   {label}: {words or '-'}")
        echo(f"   added: {shlex.join(launch['added']) or '-'}")
        for before, after in launch.get("changed", []):
            echo(f"   changed: {shlex.join(before)} -> {shlex.join(after)}")
        for label, key in (("env unset", "env_dropped"), ("env kept", "env_kept"), ("env simulated", "simulated_env")):
            if launch[key]:
                echo(f"   {label}: {', '.join(launch[key])}")
    echo(p["execstart_diff"].rstrip() or "   ExecStart unchanged")
    echo("-- drop-in to install:")
    echo(p["dropin"].rstrip())
    echo(f"-- files to push ({len(p['files'])} + {len(p['kernels'])} kernels):")
    for path, digest in {**p["files"], **p["kernels"]}.items():
        echo(f"   {digest[:16]}  {path}")
    echo(f"-- smoke tests: {', '.join(p['smoke']) or 'none'}")
    echo(f"-- steps: {' -> '.join(p['steps'])}")
    echo(f"-- gates: {', '.join(p['gates']) or 'none'}")


def _print_deploy_summary(outcomes) -> None:
    for o in outcomes:
        if o.status == "refused":
            echo(f"fleetspec: {o.reason if o.reason.startswith(o.host) else o.host + ': ' + o.reason}", err=True)
    if all(o.status == "refused" for o in outcomes) and len(outcomes) == 1:
        return
    rows = []
    for o in outcomes:
        figures = ", ".join(f"{k}={v}" for g in o.figures.values() for k, v in (g or {}).items()
                            if isinstance(v, (int, float)))
        if o.router.get("out_s"):
            figures = ", ".join(x for x in (figures, f"out of router {o.router['out_s']:.1f}s") if x)
        rows.append([o.host, o.status, o.release or "-", o.failed_step or "-", figures or "-",
                     f"{o.seconds:.1f}s", o.reason or ""])
    echo_table(["host", "outcome", "release", "failed step", "gate figures", "time", "why"], rows)
    for o in outcomes:
        if o.status == "needs_attention":
            echo(f"{o.host} needs attention: run {o.evidence.get('command', f'fleetspec rollback {o.host}')}",
                 err=True)
        elif o.evidence.get("command"):
            echo(f"{o.host}: next, run {o.evidence['command']}", err=True)
        elif o.evidence.get("journal"):
            echo(f"{o.host} journal (last lines):", err=True)
            for line in o.evidence["journal"][-8:]:
                echo(f"  {line}", err=True)


@click.command()
@click.argument("targets", nargs=-1, required=True, shell_complete=complete_targets)
@click.option("--to", "to", default=None, shell_complete=complete_releases,
              help="A healthy release id, 'previous' (what each host's current release replaced) or 'baseline' "
                   "(default).")
@click.option("--serial", default="1", show_default=True, help="Hosts per batch (N or P%).")
@click.option("--parallel", type=int, default=0, help="Hosts at once within a batch (default: the batch size).")
@click.option("--max-fail", default=None,
              help="Failures tolerated before the later batches are skipped (K or P%; default: every host goes).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host.")
@click.pass_obj
def rollback(obj, targets, to, serial, parallel, max_fail, as_json):
    """Put hosts back on their baseline, the release before their current one (--to previous)
    or a healthy release: byte-exact unit, then probes. A rollout with an id, as a deploy is.

    \b
    Example: fleetspec rollback @gpu --to previous --serial 2 --max-fail 0
    """
    from fleetspec.ops import rollouts
    from fleetspec.ops.drain import seats
    from fleetspec.ops.fleet import Strategy

    progress = Progress(enabled=not as_json)
    hosts = obj.select(targets, False)
    strategy = Strategy.parse(len(hosts), canary=0, serial=serial, max_fail=max_fail or str(len(hosts)),
                              parallel=parallel, rollback_all_on_abort=False)
    record = rollouts.create(obj.root_path, rollouts.new_record(
        "rollback", [[h.name for h in b] for b in strategy.batches(hosts)], ["fleetspec", *sys.argv[1:]],
        to=to or "baseline", strategy=dataclasses.asdict(strategy)))
    results, code = rollouts.run_rollback(obj.root_path, record, hosts, to, connect=obj.transport,
                                          echo=progress.echo, progress=progress.line, seats=seats(obj.inv, hosts),
                                          strategy=strategy,
                                          on_error=lambda err: None if as_json else echo(f"fleetspec: {err}",
                                                                                         err=True))
    progress.line(None)
    if as_json:
        for r in results:
            echo(json.dumps({**r, "rollout": record.id}, default=str, sort_keys=True))
    else:
        echo_table(["host", "outcome", "from", "to", "time", "note"],
                   [[r["host"], r["status"], r.get("left") or "baseline" if r["status"] != "error" else "-",
                     r.get("target", "-"), f"{r.get('seconds', 0):.1f}s", r.get("note") or r.get("reason", "")]
                    for r in results])
        echo(f"rollout {record.id} {record.state}: fleetspec rollouts show {record.id}")
    sys.exit(code)


@click.command()
@click.argument("host", shell_complete=complete_hosts)
@click.option("--force", is_flag=True, required=True, help="Required: end a stale holder.")
@click.pass_obj
def unlock(obj, host, force):
    """End a stale deploy lock. Refused while its holder is alive (its process on this
    controller, or its session on the host, which sends a heartbeat).

    \b
    Example: fleetspec unlock ct129 --force
    """
    from fleetspec.model.layout import HostLayout
    from fleetspec.remote.lock import force_unlock

    h = obj.select_one(host, "unlock")
    holder = force_unlock(obj.transport(h), str(HostLayout(h.vars.service).lock))
    echo(f"{h.name}: unlocked (was held by {holder.describe()})" if holder else f"{h.name}: not locked")


@click.command()
@click.argument("host", shell_complete=complete_hosts)
@click.option("--retake", is_flag=True, required=True, help="Record the service as it is now as the new baseline.")
@click.pass_obj
def baseline(obj, host, retake):
    """Re-record the baseline after the operator changed the service by hand.

    \b
    Example: fleetspec baseline ct129 --retake
    """
    from fleetspec.ops.baseline import retake as do_retake

    h = obj.select_one(host, "baseline")
    echo(do_retake(obj.transport(h), h, obj.root_path))


COMMANDS = [deploy, rollback, unlock, baseline]

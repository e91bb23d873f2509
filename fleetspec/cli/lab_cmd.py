"""`fleetspec lab …`: the lab of real containers that stands in for the fleet (see fleetspec/lab)."""

from __future__ import annotations

import json

import click

from fleetspec.cli.output import echo


def _root(ctx):
    return ctx.obj.root_path


@click.group()
def lab():
    """Bring the lab fleet (systemd-nspawn hosts with real sglang) up, down, or break it on purpose."""


@lab.command("up")
@click.option("--hosts", "host_list", default="ct129,ct200", show_default=True,
              help="Comma-separated host names; ct<N> with N<200 clones ct129, others clone ct200.")
@click.pass_context
def up_cmd(ctx, host_list):
    """Build (or reuse) the image and boot the hosts; idempotent."""
    from fleetspec.lab import lab as lab_ops

    names = [n.strip() for n in host_list.split(",") if n.strip()]
    result = lab_ops.up(_root(ctx), names, log=lambda m: echo(m, err=True))
    for name, addr in sorted(result.addresses.items()):
        how = "started" if name in result.started else "reused" if name in result.reused else "kept"
        echo(f"{name:10} {addr:15} {how}")
    echo(f"inventory: {result.inventory}  ({result.seconds:.1f} s"
         f"{', image built' if result.image_built else ''})")


@lab.command("down")
@click.option("--all", "everything", is_flag=True,
              help="Stop every lab host on this machine, also those another checkout booted.")
@click.pass_context
def down_cmd(ctx, everything):
    """Stop this fleet root's lab hosts and remove their mounts, namespaces and cgroups; the bridge
    and crash debris go once no lab host is left.

    \b
    Example: fleetspec lab down
    """
    from fleetspec.lab import lab as lab_ops

    try:
        root = _root(ctx)
    except Exception:
        root = None
    problems = lab_ops.down(root, everything=everything)
    if problems:
        raise click.ClickException("left behind: " + "; ".join(problems))
    echo("lab is down")


@lab.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status_cmd(ctx, as_json):
    """Show the lab hosts, their addresses and whether ssh and the service answer."""
    from fleetspec.lab import lab as lab_ops

    rows = lab_ops.status(_root(ctx))
    if as_json:
        echo(json.dumps(rows, indent=1))
        return
    if not rows:
        echo("no lab hosts (fleetspec lab up)")
    for r in rows:
        echo(f"{r['host']:10} {r['address']:15} {r['profile']:6} sglang {r['sglang']:13} "
             f"{'running' if r['running'] else 'stopped'}  ssh={'ok' if r['ssh'] else 'no'}  "
             f"service={r['service'] or '-'}")


@lab.command("fault")
@click.argument("host")
@click.argument("kinds", nargs=-1)
@click.option("--clear", is_flag=True, help="Remove every fault on HOST.")
@click.pass_context
def fault_cmd(ctx, host, kinds, clear):
    """Switch faults on for HOST: KIND or KIND=VALUE (crash_at_start, hang_at_start,
    health_503_after=S, wrong_algorithm=NAME, garbage_output, slow_tokens=F, slow_load=S, disk_full)."""
    from fleetspec.errors import UserError
    from fleetspec.lab import faults

    if clear and kinds:
        raise UserError("lab fault: give either KIND… or --clear, not both")
    if not clear and not kinds:
        raise UserError("lab fault: name at least one KIND[=VALUE], or --clear")
    active = faults.clear(_root(ctx), host) if clear else faults.apply(_root(ctx), host, kinds)
    echo(f"{host}: faults {json.dumps(active) if active else 'none'}")


COMMANDS = [lab]

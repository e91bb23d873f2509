"""The `fleetspec` command: options in, tables/JSON out, exit codes. No logic lives here.

Each command group is its own module; this one assembles them and maps errors to exit codes.
"""

from __future__ import annotations

import sys

import click

from fleetspec.errors import FleetspecError


class FleetspecGroup(click.Group):
    """Turns FleetspecError into one line on stderr and its exit code; never a traceback. (The SSH
    pool is closed by the root context's close, registered where the pool is made: cli/context.py.)"""

    def list_commands(self, ctx):
        from fleetspec.cli import commands

        return sorted({*self.commands, *commands.MODULES})

    def get_command(self, ctx, name):
        """Import a command's module the first time it is asked for (cli/commands.py)."""
        if name not in self.commands:
            from fleetspec.cli import commands, examples

            for command in commands.load(name):
                if command.name not in self.commands:
                    self.add_command(command)
                    examples.install_command(command)
        return self.commands.get(name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except FleetspecError as err:
            from fleetspec.cli.output import echo

            echo(f"fleetspec: {err}", err=True)
            sys.exit(err.exit_code)


@click.group(cls=FleetspecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--root", envvar="FLEETSPEC_ROOT", type=click.Path(file_okay=False), default=None,
              help="Fleet root (folder with inventory/, playbooks/, templates/). Default: walk up from here.")
@click.option("-i", "--inventory", envvar="FLEETSPEC_INVENTORY", default=None,
              help="Inventory name in inventory/ or a path. Default: lab.yaml, then production.yaml.")
@click.option("--accept-new-host-key", is_flag=True, help="Trust and record host keys never seen before.")
@click.option("-v", "--verbose", is_flag=True,
              help="Print every remote command (secrets redacted) with its duration and exit code, to stderr.")
@click.version_option(package_name="fleetspec")
@click.pass_context
def main(ctx, root, inventory, accept_new_host_key, verbose):
    """Deploy speculative-decoding changes to SGLang hosts, prove them, and roll them back.

    \b
    Example: fleetspec -v status @gpu
    """
    import faulthandler
    import logging
    import signal

    from fleetspec.cli.context import Context

    # `kill -USR1 PID` prints every thread's stack to stderr: how to see where a stuck deploy waits.
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, ValueError, OSError):   # no SIGUSR1, or stderr is not a real file (tests)
        pass

    # paramiko logs every refused direct-tcpip channel while a model loads; probes report those.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)

    ctx.obj = Context(root=root, inventory=inventory, accept_new_host_key=accept_new_host_key)
    if verbose:
        from fleetspec.cli.output import verbose_observer
        from fleetspec.remote import transport

        observer = verbose_observer(ctx.obj)
        route = lambda host, text, seconds: observer(host, text, seconds, "connected")
        transport.add_observer(observer)
        transport.add_route_observer(route)
        ctx.call_on_close(lambda: transport.remove_observer(observer))
        ctx.call_on_close(lambda: transport.remove_route_observer(route))



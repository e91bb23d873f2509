"""render: the launch a deploy would derive, from a file or an argv, or a patched LeaderWorkerSet."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from fleetspec.cli.completion import complete_algos
from fleetspec.cli.gate_cmd import load_playbook_option
from fleetspec.cli.output import echo


def _vars(pairs) -> dict[str, str]:
    from fleetspec.errors import UserError

    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip().isidentifier():
            raise UserError(f"--var {pair!r}: expected NAME=VALUE (e.g. draft_model_path=/models/draft)")
        out[name.strip()] = value
    return out


@click.command()
@click.argument("argv", nargs=-1)
@click.option("--algo", shell_complete=complete_algos, help="The playbook to derive for (playbooks/ALGO.yaml).")
@click.option("--playbook", "playbook_file", metavar="FILE", help="A playbook file instead of --algo.")
@click.option("--sglang", "version", required=True, metavar="VERSION",
              help="The sglang version the command runs (its parser splits the argv).")
@click.option("--file", "source", metavar="FILE",
              help="A systemd unit (docker/podman run units too), a Quadlet .container or a compose file.")
@click.option("--service", metavar="NAME", help="The compose service (default: the one that runs sglang).")
@click.option("--lws", "lws_file", metavar="FILE.yaml", help="A LeaderWorkerSet manifest: print it patched.")
@click.option("--release-image", metavar="REF", help="--lws: the versioned image holding the release (/release).")
@click.option("--var", "host_vars", multiple=True, metavar="NAME=VALUE",
              help="What the playbook reads as host.NAME (draft_model_path=…); repeatable.")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE", help="Override a playbook option.")
@click.option("--hybrid", is_flag=True, help="The target is hybrid (linear attention / recurrent layers).")
@click.option("--gpu-memory", type=float, metavar="MIB", help="The smallest GPU's memory in MiB (cuda graph sizing).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (with --lws: the manifest under `manifest`).")
@click.pass_obj
def render(obj, argv, algo, playbook_file, version, source, service, lws_file, release_image, host_vars, sets,
           hybrid, gpu_memory, as_json):
    """Print the launch a deploy would derive for an algo: argv, environment set and unset, notes;
    a refusal is preflight's own one line (exit 2). From --file, an ARGV after `--`, or --lws
    (the manifest with its leader and worker templates patched, everything else byte for byte).

    \b
    Example: fleetspec render --lws lws.yaml --algo ddtree --sglang 0.5.23 --var draft_model_path=/models/d --release-image registry.example/fleetspec-release:ddtree-1
    """
    from fleetspec.errors import UserError
    from fleetspec.model.overrides import parse_overrides
    from fleetspec.ops import render_launch

    if sum(map(bool, (argv, source, lws_file))) != 1:
        raise UserError("give one source: --file FILE, --lws FILE.yaml, or the command after `--`")
    pb = load_playbook_option(obj, algo, playbook_file)
    target = render_launch.Target(version, _vars(host_vars), hybrid, parse_overrides(pb, sets), gpu_memory)
    if lws_file:
        text, rendered = render_launch.lws(Path(lws_file), pb, target, release_image)
        if as_json:
            echo(json.dumps({"manifest": text, "containers": [r.to_json() for r in rendered]}, sort_keys=True))
        else:
            sys.stdout.write(text)
        return
    r = (render_launch.from_file(Path(source), pb, target, service) if source
         else render_launch.from_argv(list(argv), pb, target))
    if as_json:
        echo(json.dumps(r.to_json(), sort_keys=True))
        return
    echo(f"# {r.source} ({r.form}), sglang {version}, {pb.algo}")
    echo(f"argv: {shlex.join(r.argv)}")
    for name, value in r.env_set.items():
        echo(f"env set: {name}={value}")
    for name in r.env_unset:
        echo(f"env unset: {name}")
    for note in r.notes:
        echo(f"note: {note}")


COMMANDS = [render]

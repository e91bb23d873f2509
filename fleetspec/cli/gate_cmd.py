"""gate: the playbook's gates between a baseline and a candidate SGLang endpoint, by URL."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from fleetspec.cli.completion import complete_algos
from fleetspec.cli.output import echo


def _levels(values) -> tuple[int, ...]:
    from fleetspec.errors import UserError

    out: list[int] = []
    for value in values:
        for word in str(value).split(","):
            if not word.strip().isdigit() or int(word) < 1:
                raise UserError(f"--concurrency {value}: expected positive whole numbers (1,4,16)")
            out.append(int(word))
    return tuple(sorted(set(out)))


def load_playbook_option(obj, algo: str | None, playbook: str | None):
    """The playbook as deploy resolves it (`--algo` under the fleet root's playbooks/), or a file
    (`--playbook`); both given must agree."""
    from fleetspec.errors import UserError
    from fleetspec.model.playbook import load_playbook, load_playbook_for

    if playbook:
        if not Path(playbook).is_file():
            raise UserError(f"--playbook {playbook}: no such file")
        pb = load_playbook(playbook)
        if algo and algo != pb.algo:
            raise UserError(f"--algo {algo} but --playbook {playbook} is algo {pb.algo}")
        return pb
    if not algo:
        raise UserError("name the playbook: --algo NAME (playbooks/NAME.yaml under the fleet root) or --playbook FILE")
    return load_playbook_for(obj.root_path, algo)


@click.command()
@click.option("--baseline", required=True, metavar="URL|FILE",
              help="The baseline endpoint (http://HOST:PORT), or a file `--record` wrote.")
@click.option("--candidate", metavar="URL", help="The candidate endpoint (http://HOST:PORT).")
@click.option("--algo", shell_complete=complete_algos, help="The playbook whose gates apply (playbooks/ALGO.yaml).")
@click.option("--playbook", "playbook_file", metavar="FILE", help="A playbook file instead of --algo.")
@click.option("--concurrency", multiple=True, metavar="N[,N…]",
              help="Throughput gate levels (replace the playbook's); repeat or comma-separate.")
@click.option("--hybrid", is_flag=True, help="The target is hybrid: the parity gate's hybrid tolerance applies.")
@click.option("--bake", is_flag=True, help="Also run the playbook's bake: both sides' /metrics over its duration.")
@click.option("--record", metavar="FILE", help="Measure the baseline only and write it to FILE (no candidate).")
@click.option("--api-key-env", metavar="NAME", help="Environment variable holding the endpoints' --api-key.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@click.pass_obj
def gate(obj, baseline, candidate, algo, playbook_file, concurrency, hybrid, bake, record, api_key_env, quiet):
    """Judge a candidate endpoint against a baseline with the playbook's acceptance, throughput and
    parity gates (and its bake with --bake). Prints the verdict and figures as JSON; exits 0 pass,
    1 fail, 3 inconclusive (an endpoint not answering, figures missing), 2 bad input.

    \b
    Example: fleetspec gate --baseline http://sglang-old:30000 --candidate http://sglang-canary:30000 --algo ddtree
    """
    from fleetspec.errors import UserError
    from fleetspec.ops import endpoint_gate
    from fleetspec.remote.http_direct import HttpDirect

    pb = load_playbook_option(obj, algo, playbook_file)
    key = None
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise UserError(f"--api-key-env {api_key_env}: the variable is not set")
    settings = endpoint_gate.Settings(pb, concurrency=_levels(concurrency), hybrid=hybrid, api_key=key, bake=bake)
    note = (lambda line: None) if quiet else (lambda line: echo(f"gate: {line}", err=True))
    is_url = "://" in baseline                  # a URL (checked by HttpDirect), else a recorded file
    if record:
        if candidate or not is_url:
            raise UserError("--record measures a baseline URL and writes it: give --baseline URL and no --candidate")
        note(f"measuring the baseline {baseline}")
        code, shown, data = endpoint_gate.record(HttpDirect(baseline, "baseline"), settings)
        if data is not None:
            Path(record).write_text(json.dumps(data, sort_keys=True) + "\n")
            shown["recorded"] = record
        echo(json.dumps(shown, sort_keys=True))
        sys.exit(code)
    if not candidate:
        raise UserError("--candidate URL is required (or --record FILE to measure the baseline only)")
    if bake and pb.bake is None:
        raise UserError(f"--bake: {pb.path} has no bake: section")
    if bake and not is_url:
        raise UserError("--bake needs a baseline URL: the bake compares both sides' /metrics over one window")
    target = HttpDirect(candidate, "candidate")
    base = HttpDirect(baseline, "baseline") if is_url else endpoint_gate.from_record(Path(baseline))
    report = endpoint_gate.run(settings, base, target, note=note)
    echo(json.dumps(report.to_json(settings), sort_keys=True, default=str))
    sys.exit(report.exit_code)


COMMANDS = [gate]

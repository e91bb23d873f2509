"""`fleetspec bench HOST --algo A[:opt=v,…] …`: tokens/s and acceptance per algo, side by side."""

from __future__ import annotations

import json

import click

from fleetspec.cli.output import Progress, echo, echo_table


def _runs(obj, specs):
    from fleetspec.model.overrides import parse_overrides
    from fleetspec.model.playbook import load_playbook_for

    runs = []
    for spec in specs:
        algo, _, opts = spec.partition(":")
        playbook = load_playbook_for(obj.root_path, algo)
        runs.append((algo, parse_overrides(playbook, [o for o in opts.split(",") if o], flag=f"--algo {algo}:")))
    return runs


@click.command()
@click.argument("host")
@click.option("--algo", "algos", multiple=True, required=True, metavar="ALGO[:NAME=VALUE,…]",
              help="An algo to measure, optionally with playbook options (repeat: --algo nextn --algo ddtree:budget=32).")
@click.option("--concurrency", multiple=True, type=int, default=(1, 4), show_default=True)
@click.option("--requests", type=int, default=16, show_default=True)
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def bench(obj, host, algos, concurrency, requests, max_new_tokens, as_json):
    """Deploy each algo in turn (probes, no gates), measure it, and put the host back."""
    from fleetspec.ops.bench import bench_host

    h = obj.select_one(host, "bench")
    runs = _runs(obj, algos)
    progress = Progress(enabled=not as_json)
    rows = bench_host(obj.transport(h), h, obj.root_path, runs, concurrency=concurrency, requests=requests,
                      max_new_tokens=max_new_tokens, echo=progress.echo, progress=progress.line)
    progress.line(None)
    if as_json:
        for r in rows:
            echo(json.dumps(r.__dict__, sort_keys=True, default=str))
        return
    levels = list(concurrency)
    echo_table(["host", "algo", "options", "served", "accept length", *[f"tok/s c={c}" for c in levels],
                *[f"TPOT ms c={c}" for c in levels], "error"],
               [[r.host, r.algo, ",".join(f"{k}={v}" for k, v in r.options.items()) or "-", r.served or "-",
                 r.accept_length if r.accept_length is not None else "-",
                 *[r.figures.get(f"tok_s_c{c}", "-") for c in levels],
                 *[r.figures.get(f"tpot_ms_c{c}", "-") for c in levels], r.error] for r in rows])


COMMANDS = [bench]

"""patchset build, verify, show: make and inspect the files a playbook lays over one sglang version."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fleetspec.cli.output import echo_table
from fleetspec.model import patchset as P


@click.group("patchset")
def patchset_group():
    """Patch sets: files added to or replacing modules of one exact package version."""


@patchset_group.command("build")
@click.option("--base", required=True, metavar="PACKAGE==VERSION", help="The exact base, e.g. sglang==0.5.13.post1.")
@click.option("--from", "source", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder of changed files laid out as in site-packages (sglang/…).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Patch set folder to write (default: ./PACKAGE-VERSION).")
@click.option("--wheels", type=click.Path(file_okay=False, path_type=Path), default=P.WHEEL_CACHE,
              show_default=True, help="Where the base wheel is cached.")
def build(base, source, out, wheels):
    """Build a manifest against the real base wheel's RECORD."""
    package, version = P.parse_base(base)
    ps = P.build_patchset(base, source, out or Path(f"{package}-{version}"), wheels)
    adds = sum(f.action == "add" for f in ps.files)
    click.echo(f"{ps.root}: {package}=={version}, {len(ps.files) - adds} replaced, {adds} added"
               + (f", extra top level: {', '.join(ps.extra_top_level)}" if ps.extra_top_level else ""))


@patchset_group.command("verify")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--wheels", type=click.Path(file_okay=False, path_type=Path), default=P.WHEEL_CACHE,
              show_default=True, help="Where the base wheel is cached.")
def verify(folder, wheels):
    """Check paths, file hashes, and base hashes against the real RECORD (when the wheel is cached)."""
    result = P.verify_patchset(P.load_patchset(folder), wheels)
    ps = result.patchset
    against = f"RECORD of {result.wheel.name}" if result.record_checked else "no cached wheel: base hashes not checked"
    click.echo(f"ok: {ps.root} ({ps.package}=={ps.version}, {len(ps.files)} files; {against})")


@patchset_group.command("show")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def show(folder, as_json):
    """List a patch set's files."""
    ps = P.load_patchset(folder)
    if as_json:
        click.echo(json.dumps(ps.to_json(), indent=2))
        return
    click.echo(f"{ps.package}=={ps.version}  ({ps.root})")
    echo_table(["path", "action", "sha256", "base sha256"],
               [[f.path, f.action, f.sha256[:12], (f.base_sha256 or "")[:12]] for f in ps.files])
    if ps.extra_top_level:
        click.echo(f"extra top level: {', '.join(ps.extra_top_level)}")


COMMANDS = [patchset_group]

"""patchset build, verify, show: build the files a playbook lays over one sglang version from its\ndiffs, and inspect them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from fleetspec.build import patchset as B
from fleetspec.cli.output import echo, echo_table
from fleetspec.errors import UserError
from fleetspec.model import patchset as P


@click.group("patchset")
def patchset_group():
    """Patch sets: files added to or replacing modules of one exact package version."""


@patchset_group.command("build")
@click.argument("folders", nargs=-1, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--version", "version", default=None, metavar="V",
              help="Only the patches folders of this package version (e.g. 0.5.13.post1).")
@click.option("--wheels", type=click.Path(file_okay=False, path_type=Path), default=P.WHEEL_CACHE,
              show_default=True, help="Where the base wheel is cached.")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=B.PATCHSET_CACHE,
              show_default=True, help="Build cache, keyed by the hash of the inputs.")
@click.pass_context
def build(ctx, folders, version, wheels, cache):
    """Apply each patches folder's diffs (zero fuzz) to its base wheel and lay its files in.

    FOLDERS default to every playbooks/*/patches/<package>-<version>/ of the fleet root. The result
    (manifest.json + files/) is what deploy ships; the same inputs are built once.
    """
    root = ctx.obj.root_path if ctx.obj is not None else Path.cwd()
    chosen = list(folders) or B.patches_folders(root, version)
    if not chosen:
        raise UserError(f"no patches folders (playbooks/*/patches/*/series) under {root}"
                        + (f" for version {version}" if version else ""))
    for folder in chosen:
        started = time.monotonic()
        done = B.build(folder, wheels, cache)
        ps = done.patchset
        adds = sum(f.action == "add" for f in ps.files)
        how = f"built in {time.monotonic() - started:.1f}s" if done.built else "cached"
        echo(f"{folder}: {how}: {ps.root} ({ps.package}=={ps.version}, "
             f"{len(ps.files) - adds} replaced, {adds} added)")


@patchset_group.command("verify")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--wheels", type=click.Path(file_okay=False, path_type=Path), default=P.WHEEL_CACHE,
              show_default=True, help="Where the base wheel is cached.")
def verify(folder, wheels):
    """Check paths, file hashes, and base hashes against the real RECORD (when the wheel is cached)."""
    result = P.verify_patchset(B.load_patchset(folder), wheels)
    ps = result.patchset
    against = f"RECORD of {result.wheel.name}" if result.record_checked and result.wheel else "no cached wheel: base hashes not checked"
    echo(f"ok: {ps.root} ({ps.package}=={ps.version}, {len(ps.files)} files; {against})")


@patchset_group.command("show")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def show(folder, as_json):
    """List a patch set's files."""
    ps = B.load_patchset(folder)
    if as_json:
        echo(json.dumps(ps.to_json(), indent=2))
        return
    echo(f"{ps.package}=={ps.version}  ({ps.root})")
    echo_table(["path", "action", "sha256", "base sha256"],
               [[f.path, f.action, f.sha256[:12], (f.base_sha256 or "")[:12]] for f in ps.files])
    if ps.extra_top_level:
        echo(f"extra top level: {', '.join(ps.extra_top_level)}")


COMMANDS = [patchset_group]

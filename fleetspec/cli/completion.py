"""Shell completion (click's own mechanism): host names, @groups, algos and release ids.

Enable it with `eval "$(_FLEETSPEC_COMPLETE=bash_source fleetspec)"` (zsh_source, fish_source).
Completion runs without a network: hosts and groups come from the inventory, algos from
playbooks/, release ids from the local mirror of each host's ledger (.fleetspec/hosts/). Any
error (no root, a bad inventory) completes nothing rather than printing a traceback.
"""

from __future__ import annotations

from pathlib import Path

from click.shell_completion import CompletionItem


def _context(ctx):
    from fleetspec.cli.context import Context

    params = ctx.find_root().params
    return Context(root=params.get("root"), inventory=params.get("inventory"))


def _safe(fn):
    def wrapper(ctx, param, incomplete):
        try:
            return fn(ctx, param, incomplete)
        except Exception:  # a completion must never print a traceback into a shell
            return []
    return wrapper


@_safe
def complete_hosts(ctx, param, incomplete):
    inv = _context(ctx).inv
    return [CompletionItem(name, help=h.address) for name, h in inv.hosts.items() if name.startswith(incomplete)]


@_safe
def complete_targets(ctx, param, incomplete):
    """HOST or @group (`@all` included)."""
    inv = _context(ctx).inv
    items = [CompletionItem("@" + g, help=f"{len(m)} hosts") for g, m in inv.groups.items()]
    items.append(CompletionItem("@all", help=f"{len(inv.hosts)} hosts"))
    items += [CompletionItem(name, help=h.address) for name, h in inv.hosts.items()]
    return [i for i in items if i.value.startswith(incomplete)]


@_safe
def complete_algos(ctx, param, incomplete):
    root = _context(ctx).root_path
    names = sorted(p.stem for p in (root / "playbooks").glob("*.yaml"))
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


@_safe
def complete_releases(ctx, param, incomplete):
    """Release ids from the local mirror of the host's ledger (every host's when the host is not
    known yet, e.g. `rollback HOST --to <TAB>`), newest first."""
    from fleetspec.model import ledger as L
    from fleetspec.model.layout import local_mirror
    from fleetspec.ops.history import releases

    c = _context(ctx)
    host_name = ctx.params.get("host") or next(iter(ctx.params.get("targets") or ()), None)
    host = c.inv.hosts.get(host_name) if host_name else None
    if host is not None:
        files = [local_mirror(c.root_path, host, host.vars.service) / "ledger.jsonl"]
    else:
        files = sorted(c.root_path.glob(str(local_mirror(Path(), "*", "*") / "ledger.jsonl")))
    seen: dict[str, str] = {}
    for f in files:
        if f.is_file():
            for r in releases(L.parse(f.read_text(errors="replace"))):
                seen[r.id] = r.status
    return [CompletionItem(rid, help=seen[rid]) for rid in sorted(seen, reverse=True) if rid.startswith(incomplete)]

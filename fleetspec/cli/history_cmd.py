"""`fleetspec history HOST [RELEASE]`: one line per release, or one release's whole story (its
steps as a timeline of bars, cli/timeline.py, then each step's details).

Layout only (the folding of ledger lines is ops/history.py). Every line is wrapped at spaces to
the terminal's width and no word is ever cut: a value longer than the width overflows whole.
Colour only on a TTY, never with NO_COLOR or --no-color (cli/terminal.styled).
"""

from __future__ import annotations

import json
import shlex
import time

import click

from fleetspec.cli.completion import complete_hosts, complete_releases
from fleetspec.cli.output import Out, echo, wrap
from fleetspec.cli.timeline import secs as _secs
from fleetspec.cli.timeline import spans_of, timeline

STATUS_STYLE = {"healthy": "green", "failed": "red", "rolled_back": "yellow", "superseded": "dim",
                "pruned": "dim", "started": "magenta", "staged": "magenta", "switched": "magenta",
                "ok": "green", "skipped": "dim"}


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


# ---- the table: one release per line (two when the terminal is narrow) ----------------------

def print_table(rels, out: Out) -> None:
    from fleetspec.ops.history import headline

    if not rels:
        out.line("no releases in the ledger")
        return
    rows = []
    for r in rels:
        failing = f"{r.failed_step}" if r.failed_step else "-"
        why = [f"{r.reason}." if r.reason and not r.reason.endswith(".") else r.reason] if r.failed_step else []
        rows.append([r.id, r.algo, r.status, _when(r.started)[:-4] + "Z", _secs(r.seconds), failing,
                     " ".join([*(w for w in why if w), "; ".join([*headline(r.figures), *r.events])]).strip() or "-"])
    headers = ["release", "algo", "status", "when (UTC)", "took", "failed at", "why; gate figures; later events"]
    if any(r.rollout for r in rels):          # older ledgers name none: their table stays as it was
        headers.insert(5, "rollout")
        for r, row in zip(rels, rows, strict=True):
            row.insert(5, r.rollout or "-")
    fixed = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers[:-1])]
    room = out.width - sum(fixed) - 2 * len(fixed)
    if room >= 24:
        _columns(headers, rows, fixed, room, out)
    else:
        _records(rels, rows, out)


def _columns(headers, rows, fixed, room, out: Out) -> None:
    def emit(cells, bold=False):
        fig_lines = wrap(cells[-1], room)
        head = "".join(c.ljust(w + 2) for c, w in zip(cells[:-1], fixed, strict=True))
        spans = [(0, len(head) + len(fig_lines[0]), "bold")] if bold else []
        if not bold:
            start = sum(w + 2 for w in fixed[:2])
            spans = [(start, start + len(cells[2]), STATUS_STYLE.get(cells[2], ""))]
        out.line(head + fig_lines[0], spans)
        for extra in fig_lines[1:]:
            out.line(" " * len(head) + extra)

    emit(headers, bold=True)
    for row in rows:
        emit(row)


def _records(rels, rows, out: Out) -> None:
    """Narrow terminals: the tokens on one line, the failing step and figures wrapped below."""
    from fleetspec.ops.history import headline

    for r, row in zip(rels, rows, strict=True):
        head = f"{row[0]}  {row[1]}  {row[2]}  {row[3]}  {row[4]}"
        out.styled(head, f"  {row[2]}  ", STATUS_STYLE.get(row[2]))
        if r.rollout:
            out.line(f"    rollout {r.rollout}")
        if r.failed_step:
            for ln in wrap(f"failed at {r.failed_step}: {r.reason or ''}".rstrip(": "), out.width, "    ", "  "):
                out.line(ln)
        figs = "; ".join(headline(r.figures))
        if figs:
            for ln in wrap(f"gates: {figs}", out.width, "    ", "  "):
                out.line(ln)
        if r.events:
            for ln in wrap(f"then: {'; '.join(r.events)}", out.width, "    ", "  "):
                out.line(ln)


# ---- one release's story -------------------------------------------------------------------

def _scalar(v) -> str:
    if isinstance(v, bool) or v is None or v == "":
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def pretty(key: str | None, value, width: int, indent: str) -> list[str]:
    """A value as indented `key: value` lines; strings and word lists wrap at spaces only."""
    label = f"{key}: " if key is not None else ""
    if isinstance(value, dict):
        if not value:
            return [f"{indent}{label}{{}}"]
        lines = [f"{indent}{label.rstrip()}"] if key is not None else []
        inner = indent + "  " if key is not None else indent
        for k, v in value.items():
            lines += pretty(str(k), v, width, inner)
        return lines
    if isinstance(value, list):
        if not value:
            return [f"{indent}{label}[]"]
        scalars = all(not isinstance(x, (dict, list)) for x in value)
        if scalars and not any(" " in str(x) for x in value):
            joined = shlex.join(str(x) for x in value) if key in ("argv", "new_argv", "launch_command") \
                else ", ".join(_scalar(x) for x in value)
            return wrap(joined, width, indent + "    ", indent + label)
        lines = [f"{indent}{label.rstrip()}"]
        for x in value:
            if isinstance(x, (dict, list)):
                sub = pretty(None, x, width, indent + "    ")
                lines += [indent + "  - " + sub[0].lstrip()] + sub[1:]
            else:
                lines += wrap(_scalar(x), width, indent + "    ", indent + "  - ")
        return lines
    text = _scalar(value)
    if "\n" in text:
        return [f"{indent}{label.rstrip()}"] + [ln2 for ln in text.splitlines()
                                                for ln2 in wrap(ln, width, indent + "    ", indent + "  | ")]
    return wrap(text, width, indent + "    ", indent + label)


def print_story(host_name: str, r, out: Out) -> None:
    _story_head(host_name, r, out)
    bars = timeline(spans_of(r.steps), min(out.width, 80), r.ended)
    if bars:
        out.line()
        out.line(bars[0], [(0, 8, "bold")])
        for ln in bars[1:]:
            out.line(ln)
    out.line()
    out.line("steps", [(0, 5, "bold")])
    _story_steps(r.steps, out)
    if r.statuses:
        out.line()
        out.line("status changes", [(0, 14, "bold")])
        for e in r.statuses:
            extra = ", ".join(f"{k}={_scalar(v)}" for k, v in e.detail.items() if k != "reason")
            for ln in wrap(f"{_when(e.ts)}  {e.state}{'  ' + extra if extra else ''}", out.width, "      ", "  "):
                out.line(ln)


def _story_head(host_name: str, r, out: Out) -> None:
    """The release's summary: status, algo and timing, its container, the failing step, gate figures,
    later events."""
    from fleetspec.ops.history import container_line, headline

    w = out.width
    out.line(f"release {r.id} on {host_name}", [(0, 7, "bold")])
    out.styled(f"  status {r.status}", r.status, STATUS_STYLE.get(r.status))
    for ln in wrap(f"algo {r.algo}; started {_when(r.started)}; took {_secs(r.seconds)}; by {r.by}"
                   + (f"; rollout {r.rollout}" if r.rollout else ""), w, "    ", "  "):
        out.line(ln)
    for ln in wrap(container_line(r) or "", w, "    ", "  ") if r.container else ():
        out.line(ln)
    if r.failed_step:
        for ln in wrap(f"failed at {r.failed_step}: {r.reason or '(no reason recorded)'}", w, "    ", "  "):
            out.line(ln, [(2, 11 + len(r.failed_step), "red")])
    figs = headline(r.figures)
    if figs:
        for ln in wrap("gates: " + "; ".join(figs), w, "    ", "  "):
            out.line(ln)
    if r.events:
        for ln in wrap("then: " + "; ".join(r.events), w, "    ", "  "):
            out.line(ln)


def _story_steps(steps, out: Out) -> None:
    """One line per step (name, state, seconds), its details below, then its evidence if any."""
    w = out.width
    name_w = max((len(s.name) for s in steps), default=4)
    for s in steps:
        head = f"  {s.name.ljust(name_w)}  {s.state:<7}  {_secs(s.seconds):>7}"
        out.styled(head, s.state, STATUS_STYLE.get(s.state, "red" if s.state == "failed" else None))
        detail = {k: v for k, v in s.detail.items() if k != "evidence"}
        for ln in pretty(None, detail, w, "      ") if detail else ():
            out.line(ln)
        if s.detail.get("evidence"):
            out.line("      evidence:", [(6, 15, "bold")])
            for ln in pretty(None, s.detail["evidence"], w, "        "):
                out.line(ln)


@click.command()
@click.argument("host", shell_complete=complete_hosts)
@click.argument("release", required=False, shell_complete=complete_releases)
@click.option("--json", "as_json", is_flag=True, help="The raw ledger lines (of RELEASE only, if given).")
@click.option("--limit", type=int, default=200, show_default=True, help="The last N releases (N lines with --json).")
@click.pass_obj
def history(obj, host, release, as_json, limit):
    """The host's releases, one per line: id, algo, final status, when, duration, failing step
    and gate figures. With RELEASE (an id, or a unique prefix or suffix of one): its whole story,
    its steps as a timeline of bars scaled to their seconds, every step with its figures, and the
    evidence of a failure.

    \b
    Example: fleetspec history ct129 20261201T044505Z-ddtree-3f2a
    """
    from fleetspec.ops import history as ops

    h = obj.select_one(host, "history")
    got = ops.read_ledger(obj.transport(h), h, obj.root_path)
    if got.warning:
        echo(f"warning: {got.warning}", err=True)
    skipped = got.parsed.skipped
    if skipped:
        echo(f"warning: {h.name}: skipped {len(skipped)} torn ledger line(s): {skipped[:5]}", err=True)
    if as_json:
        entries = got.parsed.entries
        if release:
            rid = ops.find(got.parsed, h.name, release).id
            entries = tuple(e for e in entries if e.release == rid)
        for e in entries[-limit:]:
            echo(e.to_line())
        return
    out = Out()
    if release:
        print_story(h.name, ops.find(got.parsed, h.name, release), out)
    else:
        print_table(ops.releases(got.parsed)[-limit:], out)


COMMANDS = [history]

"""A release's steps as a timeline of bars, plain text, as a CI tool's step view shows a job.

Pure layout: steps in, lines out. Each step is one line (name, state, seconds) with a bar placed
where the step began and as long as its seconds, on one scale for the whole release, so the
steps that took the time stand out at a glance. A pause between two steps longer than
`BREAK_S` (an operator's `rollback` hours after the deploy) is cut out of the scale and shown as
its own line, so it cannot squash the deploy's bars into dots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BREAK_S = 60.0
FILL = {"ok": "#", "failed": "!", "started": "?", "skipped": "-"}
MIN_CELLS = 10


@dataclass(frozen=True)
class Span:
    """One step on the timeline: its start (epoch seconds, None when only its end line is known)
    and its length in seconds (None when it never finished)."""
    name: str
    state: str
    start: float | None
    seconds: float | None
    ended: float | None = None


def secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 90:
        return f"{int(s // 60)}m{int(s % 60):02d}s" if s < 5400 else f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{s:.1f}s" if s >= 0.05 or s == 0 else f"{s:.2f}s"


@dataclass
class _Placed:
    span: Span
    at: float            # seconds from the release's start, pauses cut out
    length: float
    pause: float         # a pause cut out just before this step (0 when none)


def _place(spans: Sequence[Span], last_ts: float | None) -> list[_Placed]:
    """Where each step sits on the scale. A step without a start begins where the one before it
    ended; one that never finished runs to the next step's start or to the release's last line."""
    known = [s.start if s.start is not None else s.ended for s in spans]
    origin = next((t for t in known if t is not None), 0.0)
    placed: list[_Placed] = []
    cut, reached = 0.0, origin
    for i, s in enumerate(spans):
        start = s.start
        if start is None:
            start = (s.ended - (s.seconds or 0.0)) if s.ended is not None else reached
        length = s.seconds
        if length is None:
            later = [t for t in known[i + 1:] if t is not None] + ([last_ts] if last_ts is not None else [])
            length = max(0.0, min(later, default=start) - start)
        pause = start - reached if start - reached > BREAK_S else 0.0
        cut += pause
        placed.append(_Placed(s, max(0.0, start - origin - cut), max(0.0, length), pause))
        reached = max(reached, start + length)
    return placed


def _bar(p: _Placed, scale: float, cells: int) -> str:
    fill = FILL.get(p.span.state, "!")
    a = min(cells - 1, int(p.at * scale))
    b = min(cells, max(a + 1, round((p.at + p.length) * scale)))
    short = p.length * scale < 0.5
    body = ("." if fill == "#" else fill) if short else fill * (b - a)
    return (" " * a + body).ljust(cells)


def timeline(spans: Sequence[Span], width: int = 80, last_ts: float | None = None) -> list[str]:
    """The steps as lines of at most `width` columns: `  name  state  seconds  |bar|`, a header
    saying what one column is worth, and a scale line. Empty when there is no step or the width
    leaves fewer than MIN_CELLS columns for the bars."""
    if not spans:
        return []
    placed = _place(spans, last_ts)
    name_w = min(14, max(len(s.name) for s in spans))
    state_w = max(len(s.state) for s in spans)
    secs_w = max(len(secs(s.seconds)) for s in spans)
    lead = 2 + name_w + 2 + state_w + 2 + secs_w + 2
    cells = width - lead - 2
    if cells < MIN_CELLS:
        return []
    total = max(p.at + p.length for p in placed) or 1.0
    scale = cells / total
    lines = [f"timeline: {secs(total)} on one scale, one column = {secs(total / cells)}"
             + ("; pauses cut out" if any(p.pause for p in placed) else "")]
    for p in placed:
        if p.pause:
            lines.append(f"{' ' * (lead - 2)}~~ {secs(p.pause)} later ~~"[:width])
        head = (f"  {p.span.name[:name_w].ljust(name_w)}  {p.span.state.ljust(state_w)}  "
                f"{secs(p.span.seconds).rjust(secs_w)}  ")
        lines.append(f"{head}|{_bar(p, scale, cells)}|")
    end = secs(total)
    gap = cells + 2 - 2 - len(end)
    lines.append(" " * lead + ("0s" + " " * gap + end if gap >= 1 else ""))
    return [ln.rstrip() for ln in lines]


def spans_of(steps) -> list[Span]:
    """history.Step records as spans (the CLI's one call)."""
    return [Span(s.name, s.state, s.started, s.seconds, s.ended) for s in steps]

"""`fleetspec history HOST RELEASE`'s timeline (cli/timeline.py): the steps of ledgers captured
from real lab deploys (tests/fixtures/ledger/lab-*.jsonl) and of the recorded story, laid out as
bars on one scale; and the real CLI printing it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetspec.cli.timeline import BREAK_S, Span, spans_of, timeline
from fleetspec.model import ledger as L
from fleetspec.ops import history as H
from tests.unit.test_history import _root_with_mirror, cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ledger"
BAR = re.compile(r"^  (\S+)\s+(\S+)\s+(\S+)  \|(.*)\|$")


def captured() -> list[H.Release]:
    return [r for f in sorted(FIXTURE.glob("*.jsonl")) for r in H.releases(L.parse(f.read_text()))]


def release(rid: str) -> H.Release:
    return next(r for r in captured() if r.id == rid)


def bars(lines: list[str]) -> dict[str, str]:
    """step name -> its bar cells (the text between the two `|`)."""
    return {m[1]: m[4] for ln in lines if (m := BAR.match(ln))}


def cells_of(bar: str) -> tuple[int, int]:
    """(first, last + 1) column of a bar's marks."""
    marks = [i for i, c in enumerate(bar) if c != " "]
    return marks[0], marks[-1] + 1


@pytest.mark.parametrize("width", [80, 64, 48])
def test_every_captured_release_fits_the_width_one_line_per_step(width):
    for r in captured():
        lines = timeline(spans_of(r.steps), width, r.ended)
        assert lines and all(len(ln) <= width for ln in lines), (r.id, width)
        got = [m[1] for ln in lines if (m := BAR.match(ln))]
        assert got == [s.name for s in r.steps], r.id
        for s in r.steps:                                   # name, state and seconds on the step's line
            line = next(ln for ln in lines if ln.startswith(f"  {s.name} "))
            assert line.split()[1] == s.state


def test_bars_are_scaled_to_their_seconds_and_placed_where_they_ran():
    """A gates failure from a lab deploy on ct203 (79 s): the failed gates step (38.7 s) is the
    longest bar, drawn with `!`, about half the scale; each bar starts where the one before ended."""
    r = release("20261201T050035Z-ddtree-8644")
    lines = timeline(spans_of(r.steps), 80, r.ended)
    got = bars(lines)
    cells = len(got["gates"])
    total = max(s.ended for s in r.steps) - r.started
    for s in r.steps:
        a, b = cells_of(got[s.name])
        assert abs((b - a) - max(1.0, s.seconds / total * cells)) <= 1.5, (s.name, a, b)
        assert abs(a - (s.started - r.started) / total * cells) <= 1.5, (s.name, a)
    assert set(got["gates"].strip()) == {"!"} and set(got["probes"].strip()) == {"#"}
    assert max(got, key=lambda n: len(got[n].strip())) == "gates"
    starts = [cells_of(got[s.name])[0] for s in r.steps]
    assert starts == sorted(starts)
    assert cells_of(got["revert"])[1] == cells                 # the last step ends at the scale's end
    assert got["preflight"].strip() == "."                     # 0.03 s: a mark, not a bar
    assert lines[0].startswith("timeline: 79.3s") and lines[-1].split() == ["0s", "79.3s"]


def test_a_step_that_never_finished_is_a_question_mark():
    """The deploy on ct203 that died in its probes (captured): `started`, no seconds, a `?`."""
    r = release("20261201T045802Z-ddtree-b6f6")
    lines = timeline(spans_of(r.steps), 80, r.ended)
    probes = next(ln for ln in lines if ln.startswith("  probes "))
    assert probes.split()[1:3] == ["started", "-"] and bars(lines)["probes"].strip() == "?"


def test_a_later_rollback_is_cut_out_of_the_scale():
    """`fleetspec rollback` two hours after a healthy deploy writes under the same release: the pause
    is one line of its own and the deploy's bars keep their size."""
    text = (FIXTURE / "lab-ct133.jsonl").read_text()
    r0 = H.releases(L.parse(text))[0]
    later = r0.ended + 7200
    text += L.render([L.Entry("step", r0.id, "rollback", "started", later, "0@x:1", {"to": "baseline"}),
                      L.Entry("step", r0.id, "rollback", "ok", later + 9.5, "0@x:1", {"to": "baseline", "seconds": 9.5})])
    r = H.releases(L.parse(text))[0]
    before, after = bars(timeline(spans_of(r0.steps), 80, r0.ended)), timeline(spans_of(r.steps), 80, r.ended)
    assert any(ln.strip() == "~~ 2h00m later ~~" for ln in after), after
    assert "pauses cut out" in after[0]
    got = bars(after)
    assert len(got["probes"].strip()) >= len(before["probes"].strip()) - 3   # not squashed into a dot
    assert cells_of(got["rollback"])[1] == len(got["rollback"])


def test_narrow_or_empty_gives_no_timeline():
    r = release("20261201T050035Z-ddtree-8644")
    assert timeline(spans_of(r.steps), 30, r.ended) == []
    assert timeline([], 80) == []
    one = timeline([Span("stage", "failed", 100.0, 0.0)], 80)
    assert bars(one)["stage"].strip() == "!" and all(len(ln) <= 80 for ln in one)
    assert BREAK_S >= 30


def test_history_prints_the_timeline_above_the_steps(tmp_path):
    """The real CLI: `history ct203 8644` at 80 columns shows the timeline, then the step details."""
    text = (FIXTURE / "lab-ct203failures.jsonl").read_text()
    root = _root_with_mirror(tmp_path, "ct203", text)
    r = cli(root, "history", "ct203", "8644")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    head, _, details = out.partition("\nsteps\n")
    assert "timeline: 79.3s" in head and details
    lines = head[head.index("timeline:"):].splitlines()
    assert all(len(ln) <= 80 for ln in lines)
    assert list(bars(lines)) == [s.name for s in release("20261201T050035Z-ddtree-8644").steps]
    assert set(bars(lines)["gates"].strip()) == {"!"}
    wide = cli(root, "history", "ct203", "8644", columns=200).stdout.partition("\nsteps\n")[0]
    assert max(len(ln) for ln in wide[wide.index("timeline:"):].splitlines()) <= 80   # stays 80 wide

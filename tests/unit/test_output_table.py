"""The deploy/rollback/bench summary table: fits the width, wraps at spaces, never cuts a word
(the row is the deploy summary a lab run printed, cut mid-id and mid-number before)."""

import pytest

from fleetspec.cli.output import table_lines

HEADERS = ["host", "outcome", "release", "failed step", "gate figures", "time", "why"]
ROW = ["ct203", "rolled_back", "20261201T050035Z-ddtree-8644", "gates",
       "accept_length=4.076, samples=8, baseline_accept_length=3.149, tok_s_c1=40.8, baseline_tok_s_c1=162.7, "
       "ratio_c1=0.25, tok_s_c4=152.9, baseline_tok_s_c4=637.0, ratio_c4=0.24, prompts_compared=8",
       "83.8s", "gates: throughput fail: release/baseline tokens/s 0.240 < 0.5"]


@pytest.mark.parametrize("width", [50, 80, 120, 160, 400])
def test_fits_and_cuts_nothing(width):
    lines = table_lines(HEADERS, [ROW], width)
    assert all(len(ln) <= width for ln in lines), lines
    printed = set(" ".join(lines).split())
    for cell in ROW:
        for word in cell.split():
            assert word in printed, (word, lines)


def test_wide_is_one_row_and_narrow_is_a_block():
    assert len(table_lines(HEADERS, [ROW], 400)) == 2                   # header + one line
    wide = table_lines(HEADERS, [ROW], 160)
    assert wide[0].split()[:3] == ["host", "outcome", "release"] and "20261201T050035Z-ddtree-8644" in wide[1]
    narrow = table_lines(HEADERS, [ROW], 80)
    assert narrow[0] == "ct203" and narrow[1] == "  outcome: rolled_back"

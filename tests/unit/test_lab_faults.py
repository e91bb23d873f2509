"""`lab fault` argument parsing: kinds, values, and the one-line errors for bad ones."""

import pytest

from fleetspec.errors import UserError
from fleetspec.lab import faults


def test_parse_flags_and_values():
    assert faults.parse(["crash_at_start", "slow_tokens=4", "wrong_algorithm=EAGLE", "health-503-after=2.5",
                         "fail_requests_after=0"]) == {
        "crash_at_start": True, "slow_tokens": 4.0, "wrong_algorithm": "EAGLE", "health_503_after": 2.5,
        "fail_requests_after": 0.0}


@pytest.mark.parametrize("spec,msg", [
    ("nope", "unknown fault"), ("crash_at_start=1", "takes no value"), ("slow_load", "needs a value"),
    ("slow_load=abc", "expected a number"), ("slow_tokens=0.5", "factor of 1 or more"),
    ("slow_load=-1", "must not be negative"),
])
def test_parse_rejects(spec, msg):
    with pytest.raises(UserError, match=msg):
        faults.parse([spec])


def test_scripts_quote_and_keep_contents():
    on, off = faults.disk_full_script(), faults.disk_clear_script()
    assert "mount --make-private" in on and "mount -t overlay" in on and "ENOSPC" not in on
    assert "cp " not in on + off and "rm " not in off and "-delete" not in off   # nothing copied or deleted

"""The smoke runner: many smoke scripts in one python process, each with its own output and exit
code, stopping at the first failure; run for real by a local python."""

from __future__ import annotations

import json
import subprocess
import sys

from fleetspec.remote.smoke_host import _EMIT, parse_result
from fleetspec.remote.smoke_host import RUNNER as _SMOKE_RUNNER


def run(scripts):
    r = subprocess.run([sys.executable, "-c", _SMOKE_RUNNER], input=json.dumps(scripts), capture_output=True,
                       text=True, timeout=60)
    line = [x for x in r.stdout.splitlines() if x.startswith("FLEETSPEC-SMOKE ")][-1]
    return json.loads(line.split(" ", 1)[1])


def test_each_script_keeps_its_own_output_and_the_first_failure_stops_the_rest():
    ok = _EMIT + "import json\n_emit(True, value=41 + 1)\n"
    bad = _EMIT + "_emit(False, error='parser exited 2')\n"
    never = _EMIT + "_emit(True)\n"
    ran = run([["a", ok], ["b", bad], ["c", never]])
    assert list(ran) == ["a", "b"]
    assert ran["a"][0] == 0 and parse_result(ran["a"][1]).data["value"] == 42
    assert ran["b"][0] == 1 and parse_result(ran["b"][1]).error == "parser exited 2"


def test_an_exception_is_a_failure_with_its_message():
    ran = run([["boom", "import nosuchmodule_for_fleetspec\n"]])
    code, out = ran["boom"]
    assert code == 1 and "ModuleNotFoundError" in parse_result(out).error


def test_scripts_do_not_share_globals():
    first = _EMIT + "leak = 1\n_emit(True)\n"
    second = _EMIT + "_emit('leak' not in globals())\n"
    ran = run([["first", first], ["second", second]])
    assert parse_result(ran["second"][1]).ok

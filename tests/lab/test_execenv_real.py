"""ExecStart's $VARIABLES on a real systemd 252 host (the session's 0.5.23 lab host, like ct200).

1. What systemd really passes to the process equals what fleetspec computes from the same unit and
   the same files read over SSH (facts.env_files + facts.execenv): the manual's examples, the
   corner cases of replace_env_argv, EnvironmentFile= syntax, globs, optional files, precedence,
   UnsetEnvironment=, and random environment-file contents.
2. A unit that keeps its flags in an EnvironmentFile= deploys (the drop-in holds the expanded
   argv, which systemd holds after the reload) and rolls back to its exact bytes.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetspec.lab.profiles import CT200_ARGV, PROFILES, SERVICE, unit_text
from fleetspec.model.inventory import load_inventory
from fleetspec.remote import facts
from fleetspec.remote.facts import env_files as env_files_fact
from fleetspec.remote.facts import execenv
from fleetspec.remote.transport import Transport
from tests.lab import labtools
from tests.lab.labtools import fs
from tests.lab.test_execstart_forms import _wait

pytestmark = [pytest.mark.lab, pytest.mark.slow]

PROBE = "fleetspec-execenv.service"
ENVDIR = "/etc/fleetspec-execenv"
PRINT_ARGV = "import sys, json; print('ARGV ' + json.dumps(sys.argv[1:]), flush=True)"
FILES = {
    f"{ENVDIR}/a.env": b"# comment\n; comment\nOPTS=--tp 2 --port 30000\nQ='single $x \\n' # no\n"
                       b"D=\"dq \\\" \\\\ \\$ \\n\"\nCONT=one\\\n  two\nTRAIL=x  \nQUOTED=--a \"b c\" d\\ e\n"
                       b"OVER=a\nexport BAD=1\n1BAD=2\nJOIN=\"a\"'b' c\n",
    f"{ENVDIR}/b.env": b"OVER=b\r\nFROMFILE=file\n",
    f"{ENVDIR}/d/10-x.env": b"G=first\nG1=1\n",
    f"{ENVDIR}/d/20-y.env": b"G=second\n",
}
UNIT_BODY = (f"Environment=ONE='one' \"TWO='two two' too\" THREE=\n"
             f"Environment=\"ONE2=one\" 'TWO2=two two' FROMFILE=unit KEEP=k GONE=g VAL=v\n"
             f"EnvironmentFile={ENVDIR}/a.env\nEnvironmentFile=-{ENVDIR}/missing.env\n"
             f"EnvironmentFile={ENVDIR}/b.env\nEnvironmentFile={ENVDIR}/d/*.env\n"
             f"UnsetEnvironment=GONE VAL=other\n")
EXEC_WORDS = [
    "${ONE} ${TWO} ${THREE}", "$ONE $TWO $THREE", "$ONE2 $TWO2 ${TWO2}",
    "$OPTS ${OPTS} --port=$PORTX --x=${OPTS}", "$$OPTS $${OPTS} a$$$${OPTS} ${OPTS:-z} ${OPTS",
    "$ ${} $OPTS.x $NOPE ${NOPE} x${NOPE}y", "${Q} $Q ${D} $D ${CONT} ${TRAIL}| $QUOTED ${QUOTED}",
    "${OVER} ${FROMFILE} ${G} ${G1} ${KEEP} ${GONE} $GONE ${VAL} ${BAD} ${JOIN} ${LANG} ${PATH}",
]


@pytest.fixture(scope="module")
def host(lab_fleet):
    name = lab_fleet.hosts[1]
    transport = Transport(load_inventory(lab_fleet.inventory).hosts[name])
    yield lab_fleet, name, transport
    transport.run_script(f"rm -rf {ENVDIR} /etc/systemd/system/{PROBE}; systemctl daemon-reload")
    transport.close()


def _systemd_argvs(t, unit: str, files: dict[str, bytes]) -> list[list[str]]:
    script = [f"rm -rf {ENVDIR}", f"mkdir -p {ENVDIR}/d"]
    t.run_script("; ".join(script), check=True)
    for path, data in files.items():
        t.put_bytes(data, path, mode=0o600)
    t.put_bytes(unit.encode(), f"/etc/systemd/system/{PROBE}")
    r = t.run_script(f"systemctl daemon-reload && since=$(date +%s.%N) && systemctl start {PROBE} && "
                     f"journalctl -u {PROBE} --since=@$since -o cat --no-pager", timeout=120)
    assert r.rc == 0, r.stdout + r.stderr
    return [json.loads(line[5:]) for line in r.stdout.splitlines() if line.startswith("ARGV ")]


def _probe_unit(body: str, words: list[str]) -> str:
    lines = "\n".join(f"ExecStart=/usr/bin/python3 -c \"{PRINT_ARGV}\" {w}" for w in words)
    return f"[Unit]\nDescription=fleetspec execenv probe\n[Service]\nType=oneshot\n{body}{lines}\n"


def _fleetspec_argvs(t, body: str, words: list[str]) -> list[list[str]]:
    """Each ExecStart= on its own (fleetspec reads a service's one command), files read over SSH."""
    env = facts.gather(t, env_files_fact, patterns=tuple(execenv.env_file_patterns([_probe_unit(body, words)])))
    return [list(execenv.effective_exec_command(_probe_unit(body, [w]), env=env).argv[3:]) for w in words]


def test_expansion_equals_real_systemd(host):
    _, _, t = host
    unit = _probe_unit(UNIT_BODY, EXEC_WORDS)
    real = _systemd_argvs(t, unit, FILES)
    assert len(real) == len(EXEC_WORDS)
    ours = _fleetspec_argvs(t, UNIT_BODY, EXEC_WORDS)
    for words, got, want in zip(EXEC_WORDS, ours, real, strict=True):
        assert got == want, words
    assert real[0] == ["one", "'two two' too", ""]          # systemd 252 unquotes ONE='one' (the manual says 'one')
    assert real[1] == ["one", "two two", "too"]


VALUE_CHARS = st.sampled_from(list("ab =#;'\"\\$` \t\n\r{}-x") + ["\\\n", "é"])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(VALUE_CHARS, max_size=10).map("".join), min_size=1, max_size=3))
def test_random_environment_files_read_as_systemd_reads_them(host, values):
    _, _, t = host
    text = "".join(f"K{i}={v}\n" for i, v in enumerate(values)).encode()
    words = [" ".join(f"${{K{i}}} $K{i} |" for i in range(len(values)))]
    body = f"EnvironmentFile=-{ENVDIR}/a.env\n"
    real = _systemd_argvs(t, _probe_unit(body, words), {f"{ENVDIR}/a.env": text})
    assert _fleetspec_argvs(t, body, words) == real


def test_a_unit_with_variables_deploys_and_rolls_back_exactly(host):
    fleet, name, t = host
    args = CT200_ARGV[3:]
    spec_at = args.index("--speculative-algorithm")
    env_file = (f"SGLANG_OPTS={' '.join(args[2:spec_at])}\n"
                f"SPEC=\"{' '.join(args[spec_at:])}\"\n").encode()
    original = unit_text(PROFILES["ct200"])
    line = next(ln for ln in original.splitlines() if ln.startswith("ExecStart="))
    varied = original.replace(line, f"EnvironmentFile=/etc/sglang/qwen.env\nEnvironment=MODEL={args[1]}\n"
                              f"ExecStart={' '.join(CT200_ARGV[:3])} --model-path ${{MODEL}} $SGLANG_OPTS $SPEC")
    unit_path, dropins = f"/etc/systemd/system/{SERVICE}", f"/etc/systemd/system/{SERVICE}.d"
    tree = (f"sha256sum {unit_path} /etc/sglang/qwen.env; ls -A {dropins} 2>/dev/null; "
            f"systemctl show -p ExecStart --value {SERVICE} | sed 's/ ; start_time=.*//'")
    t.run_script("mkdir -p /etc/sglang", check=True)
    t.put_bytes(env_file, "/etc/sglang/qwen.env", mode=0o600)
    t.put_bytes(varied.encode(), unit_path)
    t.run_script(f"systemctl daemon-reload && systemctl restart {SERVICE}", check=True)
    try:
        _wait(fleet, name)
        fs(fleet, "baseline", name, "--retake", check_rc=0)
        before = labtools.sh(fleet, name, tree)
        assert "$SGLANG_OPTS $SPEC" in before
        plan = fs(fleet, "deploy", name, "--algo", "ddtree", "--plan", check_rc=0)
        assert "$SGLANG_OPTS (EnvironmentFile=/etc/sglang/qwen.env)" in plan.stdout + plan.stderr
        fs(fleet, "deploy", name, "--algo", "ddtree", "--yes", "--no-gates", check_rc=0)
        shown = labtools.sh(fleet, name, f"systemctl show -p ExecStart --value {SERVICE}")
        assert f"--model-path {args[1]} {' '.join(args[2:spec_at])} --speculative-algorithm DDTREE" in shown, shown
        assert "$" not in shown.split("argv[]=", 1)[1].split(" ; ", 1)[0]
        fs(fleet, "rollback", name, check_rc=0)
        assert labtools.sh(fleet, name, tree) == before
    finally:
        t.put_bytes(original.encode(), unit_path)
        t.run_script(f"rm -f /etc/sglang/qwen.env; systemctl daemon-reload && systemctl restart {SERVICE}")
        fs(fleet, "baseline", name, "--retake")

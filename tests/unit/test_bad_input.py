"""Malformed inventories and playbooks through the real CLI: exit 2 and one clear line, no traceback."""

import pytest
from click.testing import CliRunner

from fleetspec.cli import main

GOOD_INV = """\
defaults: {ssh_key: key, known_hosts: known_hosts, connect_timeout: 1}
groups: {gpu: [a]}
hosts:
  a: {address: 127.0.0.1, port: 1}
  b: {address: 127.0.0.1, port: 2}
"""

GOOD_PB = """\
algo: ddtree
speculative_algorithm: DDTREE
options: {budget: 64, verify: auto}
hybrid: {option: verify, auto: shadow-linear, refuse: [tree], otherwise: tree}
launch: {flags: [[--speculative-algorithm, DDTREE]]}
patchsets: {0.5.23: ddtree/patchsets/sglang-0.5.23}
"""


@pytest.fixture
def root(tmp_path):
    for sub in ("inventory", "playbooks/ddtree/patchsets/sglang-0.5.23", "templates"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "inventory" / "key").write_text("not really a key")
    return tmp_path


# (inventory text or None for GOOD_INV, CLI args after the root options, what the line must say)
INVENTORY_CASES = [
    ("bad-yaml", "hosts: {a: [\n", ["status"], "lab.yaml: line 2, column 1: invalid YAML"),
    ("tab-indent", "hosts:\n\ta: {address: 127.0.0.1}\n", ["status"],
     "lab.yaml: line 2, column 1: invalid YAML: found character '\\t' that cannot start any token"),
    ("unknown-key", GOOD_INV + "hostz: {}\n", ["status"], "lab.yaml: hostz: unknown key"),
    ("wrong-type", GOOD_INV.replace("port: 1}", "port: one}"), ["status"], "hosts.a.port: expected an integer, got str 'one'"),
    ("missing-host", None, ["status", "zz"], "unknown host 'zz' in"),
    ("duplicate-host", GOOD_INV + "  a: {address: 127.0.0.9}\n", ["status"], "duplicate key 'a'"),
    ("unknown-group", None, ["status", "@cpu"], "unknown group '@cpu' in"),
    ("missing-key-file", GOOD_INV.replace("ssh_key: key", "ssh_key: nokey"), ["status"], "defaults.ssh_key: key file"),
    ("bad-port", GOOD_INV.replace("port: 2}", "port: 70000}"), ["status"], "hosts.b.port: expected a port number 1-65535, got 70000"),
    ("bad-policy", GOOD_INV.replace("connect_timeout: 1", "host_key_policy: yolo"), ["status"],
     "defaults.host_key_policy: expected one of strict, accept-new, got 'yolo'"),
    ("group-member", GOOD_INV.replace("gpu: [a]", "gpu: [a, c]"), ["status"], "groups.gpu[1]: unknown host 'c'"),
    ("bad-var", GOOD_INV.replace("port: 1}", "port: 1, vars: {api_port: high}}"), ["status"], "hosts.a.vars.api_port: expected an integer"),
    ("no-inventory", None, ["-i", "nope", "status"], "inventory 'nope' not found"),
    ("not-a-mapping", "- a\n- b\n", ["status"], "lab.yaml: expected a mapping, got list"),
]


def _invoke(root, args):
    return CliRunner().invoke(main, ["--root", str(root), *args])


def _assert_one_clean_line(result, expected):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("fleetspec: ") and expected in lines[0], lines[0]
    assert "Traceback" not in result.output and not isinstance(result.exception, (KeyError, TypeError, AttributeError))


@pytest.mark.parametrize("name,text,args,expected", INVENTORY_CASES, ids=[c[0] for c in INVENTORY_CASES])
def test_bad_inventory(root, name, text, args, expected):
    (root / "inventory" / "lab.yaml").write_text(GOOD_INV if text is None else text)
    _assert_one_clean_line(_invoke(root, args), expected)


PLAYBOOK_CASES = [
    ("unknown-algo", None, "eagle9", "unknown algo 'eagle9'"),
    ("missing-patchset", GOOD_PB.replace("sglang-0.5.23}", "sglang-0.5.99}"), "ddtree",
     "patchsets.0.5.23: folder ddtree/patchsets/sglang-0.5.99 not found"),
    ("unknown-key", GOOD_PB + "gatez: {}\n", "ddtree", "ddtree.yaml: gatez: unknown key"),
    ("wrong-type", GOOD_PB.replace("budget: 64", "budget: [64]"), "ddtree", "options.budget: expected"),
    ("bad-yaml", GOOD_PB + "launch: {flags: [\n", "ddtree", "invalid YAML"),
    ("duplicate-key", GOOD_PB + "algo: ddtree\n", "ddtree", "duplicate key 'algo'"),
    ("hybrid-option", GOOD_PB.replace("option: verify", "option: nope"), "ddtree", "hybrid.option: expected the name of an option"),
    ("flag-not-option", GOOD_PB.replace("[[--speculative-algorithm", "[[speculative-algorithm"), "ddtree",
     "launch.flags[0][0]: expected an option starting with --"),
]


@pytest.mark.parametrize("name,text,algo,expected", PLAYBOOK_CASES, ids=[c[0] for c in PLAYBOOK_CASES])
def test_bad_playbook(root, name, text, algo, expected):
    if main.get_command(None, "deploy") is None:
        pytest.skip("the deploy command is not registered in this checkout")
    (root / "inventory" / "lab.yaml").write_text(GOOD_INV)
    (root / "playbooks" / "ddtree.yaml").write_text(GOOD_PB if text is None else text)
    _assert_one_clean_line(_invoke(root, ["deploy", "a", "--algo", algo, "--plan", "--yes"]), expected)


SET_PB = GOOD_PB.replace("options: {budget: 64, verify: auto}", "options: {budget: 64, verify: auto, trace: false, ratio: 0.5}")
# (command args after the host, what the one line must say): deploy --set and bench --algo A:… share one parser
SET_CASES = [
    ("int", ["deploy", "a", "--algo", "ddtree", "--set", "budget=lots"], "--set budget=lots: expected int like the default 64 in"),
    ("bool", ["deploy", "a", "--algo", "ddtree", "--set", "trace=maybe"], "expected bool (true/false, yes/no, on/off, 1/0)"),
    ("float-nan", ["deploy", "a", "--algo", "ddtree", "--set", "ratio=nan"], "--set ratio=nan: expected float"),
    ("unknown", ["deploy", "a", "--algo", "ddtree", "--set", "nosuch=1"], "ddtree.yaml has no option 'nosuch'"),
    ("no-value", ["deploy", "a", "--algo", "ddtree", "--set", "budget"], "--set 'budget': expected NAME=VALUE"),
    ("bench-int", ["bench", "a", "--algo", "ddtree:budget=lots"], "--algo ddtree: budget=lots: expected int"),
    ("bench-bool", ["bench", "a", "--algo", "ddtree:trace=maybe"], "expected bool"),
    ("bench-no-value", ["bench", "a", "--algo", "ddtree:budget"], "'budget': expected NAME=VALUE"),
]


@pytest.mark.parametrize("name,args,expected", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_bad_option_override(root, name, args, expected):
    (root / "inventory" / "lab.yaml").write_text(GOOD_INV)
    (root / "playbooks" / "ddtree.yaml").write_text(SET_PB)
    _assert_one_clean_line(_invoke(root, [*args, "--yes"] if args[0] == "deploy" else args), expected)


def test_the_cli_accepts_what_the_parser_accepts(root):
    """`--set trace=on` used to be refused by the CLI's own copy of the parser; now the deploy
    gets past option parsing and stops only at the unreachable host."""
    (root / "inventory" / "lab.yaml").write_text(GOOD_INV)
    (root / "playbooks" / "ddtree.yaml").write_text(SET_PB)
    result = _invoke(root, ["deploy", "a", "--algo", "ddtree", "--set", "trace=on", "--set", "ratio=0.25",
                            "--plan", "--yes"])
    assert result.exit_code == 4 and "--set" not in result.output, result.output      # 4: unreachable
    assert "cannot reach 127.0.0.1:1" in result.output


@pytest.mark.parametrize("extra", [["--plan"], ["--prestage"], ["--canary", "1"], ["--rollback-all-on-abort"]])
def test_stage_only_refuses_what_only_a_switching_deploy_does(root, extra):
    """`--stage-only` stops before the switch: options about switching batches are a mistake, said
    in one line before any host is contacted (the inventory's host is unreachable)."""
    (root / "inventory" / "lab.yaml").write_text(GOOD_INV)
    (root / "playbooks" / "ddtree.yaml").write_text(GOOD_PB)
    _assert_one_clean_line(_invoke(root, ["deploy", "a", "--algo", "ddtree", "--stage-only", *extra, "--yes"]),
                           f"--stage-only cannot be combined with {extra[0]}")


def test_allow_unhealthy_needs_no_gates(root):
    """Deploying onto an engine that does not serve has no baseline to measure: with the gates on,
    `--allow-unhealthy` is refused in one line before any host is contacted."""
    (root / "inventory" / "lab.yaml").write_text(GOOD_INV)
    (root / "playbooks" / "ddtree.yaml").write_text(GOOD_PB)
    _assert_one_clean_line(_invoke(root, ["deploy", "a", "--algo", "ddtree", "--allow-unhealthy", "--yes"]),
                           "--allow-unhealthy needs --no-gates")

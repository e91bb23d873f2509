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
    if "deploy" not in main.commands:
        pytest.skip("the deploy command is not registered in this checkout")
    (root / "inventory" / "lab.yaml").write_text(GOOD_INV)
    (root / "playbooks" / "ddtree.yaml").write_text(GOOD_PB if text is None else text)
    _assert_one_clean_line(_invoke(root, ["deploy", "a", "--algo", algo, "--plan", "--yes"]), expected)

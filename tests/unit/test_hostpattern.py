"""Host patterns (model/hostpattern.py, pure) and the CLI's use of them: Ansible's `:`/`!`/`&`
terms, ranges, globs, a bare group name, a typo in one short line, `--all` beside names refused,
and the single-host commands refusing a group."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.errors import UserError
from fleetspec.model.hostpattern import select, split

HOSTS = ["ct129", "ct130", "ct131", "ct200", "tn01", "tn02", "tn10"]
GROUPS = {"gpu": ["ct129", "ct130", "ct131", "ct200"], "hybrid": ["ct129", "ct131"], "thin": ["tn01", "tn02", "tn10"]}


@pytest.mark.parametrize("targets,wanted", [
    (["@gpu:!ct200"], ["ct129", "ct130", "ct131"]),
    (["!ct200:@gpu"], None),                                      # the order written does not matter…
    (["@gpu:&@hybrid"], ["ct129", "ct131"]),
    (["ct1[29:31]"], ["ct129", "ct130", "ct131"]),
    (["ct1[29:31:2]"], ["ct129", "ct131"]),
    (["tn[01:02]"], ["tn01", "tn02"]),                            # leading zeros kept
    (["ct1*"], ["ct129", "ct130", "ct131"]),
    (["tn?0"], ["tn10"]),
    (["thin"], ["tn01", "tn02", "tn10"]),                         # a bare group name, no host of that name
    (["ct200", "ct129"], ["ct129", "ct200"]),                     # inventory order, each once
    (["ct200,ct129,ct129"], ["ct129", "ct200"]),
    (["all:!@gpu"], ["tn01", "tn02", "tn10"]),
    (["@all:&ct1*:!ct130"], ["ct129", "ct131"]),
])
def test_the_grammar(targets, wanted):
    got = select(targets, HOSTS, GROUPS)
    assert got == (wanted if wanted is not None else ["ct129", "ct130", "ct131"])


def test_split_keeps_a_range_whole():
    assert split(["@gpu:!ct1[29:30]", "tn01"]) == ["@gpu", "!ct1[29:30]", "tn01"]


@pytest.mark.parametrize("targets,message", [
    (["!ct200"], "only narrows or excludes: start with what it selects, e.g. @all:!ct200"),
    (["@gpu:&@thin"], "selects no host"),
    (["ct9*"], "no host matches 'ct9*'"),
    (["ct[5:1]"], "runs backwards"),
    (["ct[1:b]"], "expected [N:M] or [a:z]"),
    (["@gpu:"], "empty term"),
    (["ct12[9"], "brackets hold a range"),
])
def test_refusals_are_one_line(targets, message):
    with pytest.raises(UserError) as err:
        select(targets, HOSTS, GROUPS)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_typo_is_one_short_line_with_at_most_three_suggestions():
    """Against 300 hosts the old message listed every one of them (2,769 characters)."""
    hosts = [f"gpu-node-{i:03d}.dc1" for i in range(300)]
    with pytest.raises(UserError) as err:
        select(["gpu-node-01.dc1"], hosts, {"gpu": hosts})
    text = str(err.value)
    assert text.startswith("unknown host 'gpu-node-01.dc1'") and "did you mean" in text, text
    assert 0 < text.count("gpu-node-0") - 1 <= 3 and len(text) < 200, text
    with pytest.raises(UserError, match=r"unknown group '@gpus' in .*; did you mean @gpu\?"):
        select(["@gpus"], hosts, {"gpu": hosts})
    with pytest.raises(UserError, match=r"unknown host 'zzz' in the inventory \(300 hosts, 1 groups"):
        select(["zzz"], hosts, {"gpu": hosts})


def test_a_name_both_host_and_group_is_refused():
    with pytest.raises(UserError, match="both a host and a group"):
        select(["ct129"], HOSTS, {**GROUPS, "ct129": ["ct129", "ct130"]})


INVENTORY = """\
defaults: {known_hosts: /dev/null, connect_timeout: 1}
groups: {gpu: [ct129, ct200], hybrid: [ct129]}
hosts:
  ct129: {address: 127.0.0.1, port: 9}
  ct200: {address: 127.0.0.1, port: 9}
  ct300: {address: 127.0.0.1, port: 9}
"""


@pytest.fixture
def root(tmp_path):
    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    (tmp_path / "inventory" / "lab.yaml").write_text(INVENTORY)
    return tmp_path


def cli(root, *args):
    return CliRunner().invoke(main, ["--root", str(root), *args])


@pytest.mark.parametrize("args,command", [
    (["unlock", "@gpu", "--force"], "unlock"),
    (["baseline", "gpu", "--retake"], "baseline"),
    (["history", "ct*"], "history"),
    (["bench", "@gpu", "--algo", "nextn"], "bench"),
])
def test_single_host_commands_refuse_a_group(root, args, command):
    """They acted on the group's first host without saying so."""
    r = cli(root, *args)
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert f"fleetspec: {command} acts on one host;" in line and "names " in line and "\n" not in line, r.output
    assert "ct129" in line and "Traceback" not in line


def test_deploy_all_with_named_hosts_is_refused(root):
    """`deploy --all ct200` deployed every host."""
    r = cli(root, "deploy", "--all", "ct200", "--algo", "nextn", "--yes")
    assert r.exit_code == 2, r.output
    assert "--all selects every host" in r.output and "cannot be combined with ct200" in r.output


def test_status_takes_a_pattern(root):
    """Exclusion, intersection and a typo through the real CLI (the hosts are unreachable: exit 4)."""
    r = cli(root, "status", "--json", "@gpu:!ct200")
    assert r.exit_code == 4 and '"host": "ct129"' in r.output and "ct200" not in r.output, r.output
    r = cli(root, "status", "ct20")
    assert r.exit_code == 2 and "did you mean ct200" in r.output, r.output

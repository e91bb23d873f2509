"""The YAML loaders: libyaml's parser (fast) and PyYAML's own (pure) read every shipped file alike,
and a refused document gets the pure loader's error, which names what it found."""

from pathlib import Path

import pytest
import yaml

from fleetspec.errors import ConfigError
from fleetspec.model import ansible_inventory, yamlload

ROOT = Path(__file__).resolve().parents[2]
GENERATED = {ROOT / "inventory" / "lab.yaml"}   # `lab up` writes it and `lab down` removes it, beside this run
SHIPPED = sorted(p for d in ("inventory", "playbooks", "tests") for p in (ROOT / d).rglob("*.y*ml")
                 if p.suffix in (".yaml", ".yml") and p not in GENERATED)


def test_there_are_shipped_yaml_files_to_compare():
    assert len(SHIPPED) >= 4 and yamlload.StrictLoader is not yamlload.PureStrictLoader


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_both_parsers_read_every_shipped_file_alike(path):
    text = path.read_text()
    for fast, pure in ((yamlload.StrictLoader, yamlload.PureStrictLoader),
                       (ansible_inventory.AnsibleLoader, ansible_inventory.PureAnsibleLoader)):
        try:
            want = yaml.load(text, Loader=pure)  # a SafeLoader
        except yaml.YAMLError as err:
            with pytest.raises(yaml.YAMLError) as got:
                yaml.load(text, Loader=fast)
            assert (got.value.problem_mark.line, got.value.problem_mark.column) == \
                   (err.problem_mark.line, err.problem_mark.column)
            continue
        assert yaml.load(text, Loader=fast) == want


@pytest.mark.parametrize("text, where, says", [
    ("a:\n\tb: 1\n", "line 2, column 1", "found character '\\t' that cannot start any token"),
    ("a: @x\n", "line 1, column 4", "found character '@' that cannot start any token"),
    ("a: *x\n", "line 1, column 4", "found undefined alias 'x'"),
    ("a: 1\na: 2\n", "line 2, column 1", "duplicate key 'a' (first at line 1)"),
])
def test_a_refused_document_gets_the_clearer_error_at_the_same_place(text, where, says):
    with pytest.raises(ConfigError) as err:
        yamlload.load_yaml_text(text, "f.yaml")
    assert str(err.value) == f"f.yaml: {where}: invalid YAML: {says}"


def test_the_ansible_loader_keeps_its_tags_on_both_parsers():
    text = "all:\n  vars:\n    a: !unsafe '{{ x }}'\n    b: !vault |\n      $ANSIBLE_VAULT;1.1\n"
    for loader in (ansible_inventory.AnsibleLoader, ansible_inventory.PureAnsibleLoader):
        data = yaml.load(text, Loader=loader)
        assert data["all"]["vars"]["a"] == "{{ x }}"
        assert isinstance(data["all"]["vars"]["b"], ansible_inventory._Vault)

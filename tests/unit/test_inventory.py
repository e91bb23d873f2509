"""Inventory loading, var merging and host selection."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetspec.cli import main
from fleetspec.errors import ConfigError, UserError
from fleetspec.model.inventory import load_inventory, resolve_inventory_path

REPO = Path(__file__).resolve().parents[2]


def test_example_production_describes_ct129_and_ct200():
    inv = load_inventory(REPO / "inventory" / "example-production.yaml")
    ct129, ct200 = inv.select(["@gpu"])
    assert ct129.vars.service == "sglang-qwen.service" and ct129.vars.api_port == 30000
    assert ct129.vars.python == "/root/ml-env/bin/python3" and ct129.vars.gpu_count == 2
    assert "hybrid" in ct129.vars.tags and ct129.vars.api_key.env == "SGLANG_API_KEY"
    assert ct200.vars.model_path.endswith("Qwen3-8B") and ct200.vars.extra["sglang_version"] == "0.5.23"
    for host in inv.hosts.values():
        assert host.address.endswith(".example") and host.jump.address.endswith(".example")


def write(tmp_path, text, name="inv.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_groups_and_host_vars_merge(tmp_path):
    (tmp_path / "key").write_text("k")
    inv = load_inventory(write(tmp_path, """
defaults: {user: ops, ssh_key: key, known_hosts: kh, connect_timeout: 3, vars: {service: a.service, gpu_count: 1}}
groups: {gpu: [h1, h2], big: [h2]}
group_vars: {gpu: {gpu_count: 2, api_port: 31000}, big: {gpu_count: 8}}
hosts:
  h1: {address: h1.test.example, vars: {tags: [hybrid]}}
  h2: {address: h2.test.example, port: 2222, user: root, jump: "j@bastion:2200", vars: {service: b.service}}
"""))
    h1, h2 = inv.hosts["h1"], inv.hosts["h2"]
    assert h1.user == "ops" and h1.ssh_key == tmp_path / "key" and h1.known_hosts == tmp_path / "kh"
    assert h1.connect_timeout == 3.0 and h1.vars.gpu_count == 2 and h1.vars.api_port == 31000
    assert h1.vars.service == "a.service" and h1.is_hybrid_tagged
    assert h2.vars.gpu_count == 8 and h2.vars.service == "b.service" and h2.user == "root"
    assert h2.known_hosts_name == "[h2.test.example]:2222" and h1.known_hosts_name == "h1.test.example"
    assert (h2.jump.user, h2.jump.address, h2.jump.port) == ("j", "bastion", 2200)
    assert [h.name for h in inv.select(["h2", "@gpu"])] == ["h1", "h2"]
    assert [h.name for h in inv.select([], all_hosts=True)] == ["h1", "h2"]
    assert [h.name for h in inv.select(["@all"])] == ["h1", "h2"]


def test_unknown_host_and_group_name_the_file(tmp_path):
    inv = load_inventory(write(tmp_path, "hosts: {h1: {address: a}}\n"))
    with pytest.raises(UserError, match=r"unknown host 'nope' in .*inv.yaml"):
        inv.select(["nope"])
    with pytest.raises(UserError, match=r"unknown group '@gpu' in .*inv.yaml"):
        inv.select(["@gpu"])


@pytest.mark.parametrize("text,match", [
    ("hosts: {h1: {address: a, port: 0}}", r"hosts\.h1\.port: expected a port number"),
    ("hosts: {h1: {address: a, colour: red}}", r"hosts\.h1\.colour: unknown key"),
    ("hosts: {h1: {address: [a]}}", r"hosts\.h1\.address: expected"),
    ("hosts: {h1: {address: a, vars: {gpus: 2}}}", r"hosts\.h1\.vars\.gpus: unknown var"),
    ("hosts: {h1: {address: a}}\nhosts: {h2: {address: b}}", r"duplicate key 'hosts'"),
    ("hosts: {h1: {address: a, jump: 'a@b@c'}}", r"hosts\.h1\.jump: expected"),
    ("hosts: {h1: {address: a, vars: {api_key: {env: X}}}}", r"api_key\.secret_env: missing"),
    ("groups: {g: [h9]}\nhosts: {h1: {address: a}}", r"groups\.g\[0\]: unknown host 'h9'"),
])
def test_bad_inventories(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_inventory(write(tmp_path, text))


def test_a_host_without_an_address_is_reached_by_its_name(tmp_path):
    """As `ssh NAME` would: the name is looked up in ~/.ssh/config (remote/ssh_config.py)."""
    host = load_inventory(write(tmp_path, "hosts: {gpu-alias: {port: 2222}}")).hosts["gpu-alias"]
    assert (host.address, host.port, host.inventory_sets) == ("gpu-alias", 2222, frozenset({"port"}))


def test_resolve_inventory_path(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETSPEC_INVENTORY", raising=False)
    (tmp_path / "inventory").mkdir()
    with pytest.raises(UserError, match="no inventory"):
        resolve_inventory_path(tmp_path)
    write(tmp_path / "inventory", "hosts: {}", "example-production.yaml")     # an example is never meant
    (tmp_path / "inventory" / "key").write_text("k")
    with pytest.raises(UserError, match="no inventory"):
        resolve_inventory_path(tmp_path)
    write(tmp_path / "inventory", "hosts: {}", "production.yaml")
    assert resolve_inventory_path(tmp_path).name == "production.yaml"
    write(tmp_path / "inventory", "hosts: {}", "lab.yaml")
    assert resolve_inventory_path(tmp_path, "production").name == "production.yaml"
    assert resolve_inventory_path(tmp_path, "lab").name == "lab.yaml"
    monkeypatch.setenv("FLEETSPEC_INVENTORY", "production.yaml")
    assert resolve_inventory_path(tmp_path).name == "production.yaml"
    with pytest.raises(UserError, match="'nope' not found"):
        resolve_inventory_path(tmp_path, "nope")


def test_two_inventories_and_no_name_is_refused_never_a_silent_choice(tmp_path, monkeypatch):
    """lab.yaml beside production.yaml (both name ct129): a bare command refuses in one line and
    names both; after `lab down` removed lab.yaml, production.yaml is the one inventory left."""
    monkeypatch.delenv("FLEETSPEC_INVENTORY", raising=False)
    for sub in ("inventory", "playbooks", "templates"):
        (tmp_path / sub).mkdir()
    for name in ("production.yaml", "lab.yaml"):
        write(tmp_path / "inventory", "hosts: {ct129: {address: ct129.example}}", name)
    with pytest.raises(UserError) as err:
        resolve_inventory_path(tmp_path)
    assert "2 inventories (lab.yaml, production.yaml): name one with -i" in str(err.value)
    assert "\n" not in str(err.value)
    r = CliRunner().invoke(main, ["--root", str(tmp_path), "status", "ct129"])
    assert r.exit_code == 2 and "name one with -i" in r.output and "Traceback" not in r.output, r.output
    (tmp_path / "inventory" / "lab.yaml").unlink()
    assert resolve_inventory_path(tmp_path).name == "production.yaml"


@pytest.mark.parametrize("defaults,host,wanted", [
    ("", "", "none"),
    ("", "user: ops", "sudo"),
    ("become: sudo", "", "sudo"),
    ("user: ops", "user: root", "none"),
    ("", "{user: ops, become: sudo}", "sudo"),
])
def test_become_defaults_to_sudo_for_users_other_than_root(tmp_path, defaults, host, wanted):
    path = tmp_path / "inv.yaml"
    d = f"defaults: {{{defaults}}}\n" if defaults else ""
    h = host if host.startswith("{") else ("{address: a.gpu.example, " + host + "}" if host else "{address: a.gpu.example}")
    if host.startswith("{"):
        h = "{address: a.gpu.example, " + host[1:]
    path.write_text(d + f"hosts:\n  a: {h}\n")
    assert load_inventory(path).hosts["a"].become == wanted


def test_become_none_for_a_user_other_than_root_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a: {address: a.gpu.example, user: ops, become: none}\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert "become" in str(err.value) and "ops" in str(err.value)

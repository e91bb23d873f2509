"""The mixed fleet: which host clones which, its address, its unit, its inventory entry."""

import json
import shlex

import pytest
import yaml

from fleetspec.errors import UserError
from fleetspec.lab import inventory, profiles


@pytest.mark.parametrize("name,like", [("ct129", "ct129"), ("ct149", "ct129"), ("ct150", "ct150"), ("ct199", "ct150"), ("ct200", "ct200"),
                                       ("ct207", "ct200"), ("bench1", "ct200")])
def test_clone_rule(name, like):
    assert profiles.for_host(name).like == like


def test_bad_name():
    with pytest.raises(UserError):
        profiles.for_host("CT 129")


def test_addresses():
    assert profiles.address("ct129", set()) == "10.200.0.129"
    assert profiles.address("bench", {"10.200.0.10"}) == "10.200.0.11"
    assert profiles.address("ct1", set()) == "10.200.0.10"  # .1 is the bridge's range rule: N >= 2


def test_ct129_unit_execstart_is_the_operators():
    unit = profiles.unit_text(profiles.PROFILES["ct129"])
    line = next(l for l in unit.splitlines() if l.startswith("ExecStart="))
    assert shlex.split(line[len("ExecStart="):]) == profiles.CT129_ARGV
    assert "--speculative-algo NEXTN" in line and "--mamba-scheduler-strategy extra_buffer" in line


def test_ct129_model_is_hybrid_and_ct200_is_not():
    hybrid = profiles.model_configs(profiles.PROFILES["ct129"])["/root/models/Qwen3.6-27B"]
    assert {"linear_attention", "full_attention"} <= set(hybrid["layer_types"])
    pure = profiles.model_configs(profiles.PROFILES["ct200"])["/root/models/Qwen3-8B"]
    assert "layer_types" not in pure
    for p in profiles.PROFILES.values():
        for dest, data in profiles.files(p).items():
            if dest.endswith("config.json"):
                json.loads(data)


def test_inventory_shape():
    data = yaml.safe_load(inventory.render({"ct129": "10.200.0.129", "ct200": "10.200.0.200"}))
    assert data["defaults"]["ssh_key"] == "../.lab/ssh/id_ed25519"
    assert data["defaults"]["host_key_policy"] == "strict"
    h = data["hosts"]["ct129"]
    assert h["address"] == "10.200.0.129"
    assert h["vars"]["python"] == "/root/ml-env/bin/python3" and h["vars"]["tags"] == ["hybrid"]
    assert data["hosts"]["ct200"]["vars"]["python"] == "/opt/sglang/venv/bin/python3"
    assert data["groups"]["hybrid"] == ["ct129"] and data["groups"]["gpu"] == ["ct129", "ct200"]


def test_ct150_is_the_tree_host_pure_attention_tp1_on_0513():
    """The one shape where the 0.5.13.post1 DDTree worker verifies a tree: not hybrid, TP=1."""
    from fleetspec.model.hybrid import hybrid_reason

    p = profiles.PROFILES["ct150"]
    assert p.version == "0.5.13.post1" and p.python == "/root/ml-env/bin/python3"
    assert hybrid_reason(profiles.model_configs(p)[p.model_path]) is None
    line = next(l for l in profiles.unit_text(p).splitlines() if l.startswith("ExecStart="))
    argv = shlex.split(line[len("ExecStart="):])
    assert argv == profiles.CT150_ARGV and argv[argv.index("--tp-size") + 1] == "1"
    assert "--speculative-algorithm" in argv and "DFLASH" in argv


def test_the_lab_inventory_names_each_relaxation_of_the_playbooks_gates():
    """Every setting the lab inventory overrides is named in docs/lab.md's "Gates on the lab" table
    with its reason; the acceptance and parity gates are never overridden."""
    from pathlib import Path

    from fleetspec.model.playbook import load_playbook

    table = (Path(__file__).resolve().parents[2] / "docs" / "lab.md").read_text().split("## Gates on the lab")[1]
    playbook = load_playbook(Path(__file__).resolve().parents[2] / "playbooks" / "ddtree.yaml")
    assert playbook.gates.throughput.min_ratio == 0.95
    for name in ("ct129", "ct200", "ct150", "tn1", "pd1", "pq1"):
        extra = profiles.inventory_vars(profiles.for_host(name))["extra"]
        gates = extra.get("gates", {})
        assert set(gates) <= {"throughput"}, (name, gates)
        for setting in [*gates.get("throughput", {}), *(["require_gpus"] if "require_gpus" in extra else [])]:
            assert f"| `{setting}` |" in table, setting

"""The baseline records Environment values, secrets redacted, and says what changed (issue 13,
item 10). A real unit and drop-in with Environment= lines, read by the project's unit parser."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from fleetspec.model.baseline import REDACTED, Baseline
from fleetspec.model.inventory import load_inventory
from fleetspec.ops.baseline import take_baseline
from fleetspec.remote.facts.unit_files import UnitFiles
from fleetspec.remote.transport import Transport
from fleetspec.systemd_unit import environment_of

UNIT_PATH = "/etc/systemd/system/sglang-qwen.service"
DROPIN_PATH = "/etc/systemd/system/sglang-qwen.service.d/10-ops.conf"
HF_TOKEN, BEARER, API_KEY = "hf_QmHkLx9secret", "bearer-7f3e-private", "sk-live-0042"

UNIT = f"""[Unit]
Description=SGLang Qwen
After=network-online.target

[Service]
Type=simple
Environment=HF_HOME=/root/.cache/hf "SGLANG_LOG_LEVEL=info verbose" HF_TOKEN={HF_TOKEN}
Environment=OMP_NUM_THREADS=8 \\
    CUDA_VISIBLE_DEVICES=0,1
Environment=PERCENT=100%% SERVE_BEARER={BEARER}
EnvironmentFile=-/etc/default/sglang
ExecStart=/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3.6-27B --tp 2
Restart=always

[Install]
WantedBy=multi-user.target
""".encode()
DROPIN = b'[Service]\nEnvironment=OMP_NUM_THREADS=4\nEnvironment="SGLANG_API_KEY=' + API_KEY.encode() + b'"\n'


@pytest.fixture
def host(sshd, ssh_client_key, inventory_writer, tmp_path):
    from tests.conftest import free_port

    path = inventory_writer(tmp_path / "inv.yaml", {"h": sshd}, ssh_client_key,
                            host_vars={"h": f"{{api_port: {free_port()}, api_key: {{secret_env: SERVE_KEY_ENV}}}}"})
    return load_inventory(path).hosts["h"]


def test_the_unit_parser_reads_environment_values_as_systemd_does():
    env = environment_of([UNIT.decode(), DROPIN.decode()])
    assert env == {"HF_HOME": "/root/.cache/hf", "SGLANG_LOG_LEVEL": "info verbose", "HF_TOKEN": HF_TOKEN,
                   "OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0,1", "PERCENT": "100%",
                   "SERVE_BEARER": BEARER, "SGLANG_API_KEY": API_KEY}
    assert environment_of([UNIT.decode(), "[Service]\nEnvironment=\nEnvironment=A=1\n"]) == {"A": "1"}


def test_the_baseline_records_values_with_secrets_redacted(host, monkeypatch):
    monkeypatch.setenv("SERVE_KEY_ENV", "unused-here")
    t = Transport(host)
    try:
        pf = SimpleNamespace(host=host, service="sglang-qwen.service", python="/usr/bin/python3",
                             unit=SimpleNamespace(fragment_path=UNIT_PATH), unit_bytes=UNIT,
                             dropins={DROPIN_PATH: DROPIN}, exec_argv=["/root/ml-env/bin/python3"],
                             sglang=SimpleNamespace(version="0.5.23", site_packages="/x", drift=()), launch=None,
                             playbook=SimpleNamespace(launch=SimpleNamespace(secret_env=("SERVE_BEARER",))))
        monkeypatch.setenv("SERVE_BEARER", BEARER)
        baseline = take_baseline(t, pf)
    finally:
        t.close()
    assert baseline.environment == {
        "CUDA_VISIBLE_DEVICES": "0,1", "HF_HOME": "/root/.cache/hf", "HF_TOKEN": REDACTED,
        "OMP_NUM_THREADS": "4", "PERCENT": "100%", "SERVE_BEARER": REDACTED,    # the playbook's secret_env
        "SGLANG_API_KEY": REDACTED, "SGLANG_LOG_LEVEL": "info verbose"}
    recorded = json.loads(baseline.to_json())["environment"]
    for secret in (HF_TOKEN, BEARER, API_KEY):
        assert secret not in json.dumps(recorded)
    assert Baseline.from_json(baseline.to_json()).environment == baseline.environment


def _baseline() -> Baseline:
    return Baseline(service="sglang-qwen.service", unit_path=UNIT_PATH, unit_bytes=UNIT,
                    dropins={DROPIN_PATH: DROPIN}, exec_argv=[], environment={}, sglang={},
                    served_algorithm=None, declared_algorithm=None, taken_at=time.time())


def _edited() -> tuple[bytes, dict]:
    unit = (UNIT.replace(b"HF_HOME=/root/.cache/hf ", b"")
                .replace(HF_TOKEN.encode(), b"hf_NEWsecret")
                .replace(b"CUDA_VISIBLE_DEVICES=0,1", b"CUDA_VISIBLE_DEVICES=0,1,2,3 NCCL_DEBUG=WARN"))
    return unit, {DROPIN_PATH: DROPIN.replace(b"OMP_NUM_THREADS=4", b"OMP_NUM_THREADS=16")}


def test_a_baseline_diff_says_which_variable_changed_and_how(host):
    unit, dropins = _edited()
    lines = _baseline().differences(unit, dropins)
    assert "Environment OMP_NUM_THREADS changed ('4' -> '16')" in lines
    assert "Environment CUDA_VISIBLE_DEVICES changed ('0,1' -> '0,1,2,3')" in lines
    assert "Environment NCCL_DEBUG added ('WARN')" in lines
    assert "Environment HF_HOME removed (was '/root/.cache/hf')" in lines
    assert "Environment HF_TOKEN changed (secret; values not shown)" in lines
    assert not any(s in " ".join(lines) for s in (HF_TOKEN, "hf_NEWsecret"))
    assert _baseline().differences(UNIT, {DROPIN_PATH: DROPIN}) == []


def test_status_says_what_changed_in_the_environment(host, monkeypatch):
    """status's unit-drift check, fed the unit files as its fact reads them; the inventory's own
    secret (api_key's variable and value) is never shown either."""
    from fleetspec.ops import status

    monkeypatch.setenv("SERVE_KEY_ENV", "inventory-key-9")
    unit, dropins = _edited()
    unit = unit.replace(b"PERCENT=100%%", b"SERVE_KEY_ENV=inventory-key-9 ODD=x-inventory-key-9")
    files = UnitFiles(fragment_path=UNIT_PATH, unit_bytes=unit, dropins=dropins,
                      baseline_json=_baseline().to_json())
    lines = status._unit_drift(None, host, files)
    assert "Environment OMP_NUM_THREADS changed ('4' -> '16')" in lines
    assert "Environment SERVE_KEY_ENV added" in lines and "Environment ODD added" in lines
    assert "Environment PERCENT removed (was '100%')" in lines
    assert "inventory-key-9" not in " ".join(lines)


def test_a_baseline_recorded_with_names_only_still_loads():
    raw = json.loads(_baseline().to_json())
    raw["environment"] = ["HF_HOME", "HF_TOKEN"]
    assert Baseline.from_json(json.dumps(raw)).environment == {"HF_HOME": None, "HF_TOKEN": None}

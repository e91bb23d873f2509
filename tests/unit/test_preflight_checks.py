"""Preflight's pure checks on real fact outputs: GPUs promised by the inventory."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetspec.errors import UserError
from fleetspec.model.inventory import Host, HostVars
from fleetspec.ops.preflight_checks import check_gpus
from fleetspec.remote.facts import gpu

CSV = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "query-gpu.csv"


def host(**extra) -> Host:
    return Host(name="ct129", address="ct129.gpu.example", vars=HostVars(gpu_count=2, extra=extra),
                inventory_path=Path("inventory/production.yaml"))


def test_two_gpus_as_promised():
    info = gpu.parse(CSV.read_text())
    assert len(info.gpus) >= 2
    assert check_gpus(host(), info) == []


def test_fewer_gpus_than_promised_is_refused():
    info = gpu.parse(CSV.read_text().splitlines()[0] + "\n")
    with pytest.raises(UserError, match="shows 1 GPU"):
        check_gpus(host(), info)


def test_no_nvidia_smi_is_refused_unless_the_inventory_says_so():
    none = gpu.parse(gpu.NO_SMI + "\n")
    with pytest.raises(UserError, match="require_gpus: false"):
        check_gpus(host(), none)
    assert "not checked" in check_gpus(host(require_gpus=False), none)[0]

"""The deploy's steps are written once (ops/steps.py): Deploy runs each by its method, --plan prints
the same order, and smoke's place follows the playbook's smoke.when."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fleetspec.model.inventory import Host
from fleetspec.ops import steps
from fleetspec.ops.deploy import Deploy, DeployRequest


def test_every_step_has_its_method_and_nothing_else_is_a_step(tmp_path):
    pf = SimpleNamespace(redact=lambda text: text)
    req = DeployRequest(host=Host(name="h", address="h.example"), playbook=SimpleNamespace(algo="ddtree"),
                        root=tmp_path)
    d = Deploy(SimpleNamespace(name="h"), req, pf)
    assert tuple(d.work) == steps.STEPS


@pytest.mark.parametrize("when", ["before-switch", "beside-load"])
def test_the_plan_shows_the_order_deploy_runs(when):
    ran = steps.order(when)
    assert sorted(ran) == sorted(steps.STEPS) and ran[0] == "preflight" and ran[-1] == "commit"
    shown = steps.plan_lines(when)
    assert shown[:2] == ["preflight", "lock"] and [line.split(" ")[0] for line in shown[2:]] == ran[1:]
    smoke = ran.index("smoke")
    assert (smoke < ran.index("switch")) if when == "before-switch" else (ran.index("restart") < smoke < ran.index("probes"))

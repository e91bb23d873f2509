"""Issue 13 item 1 on a real lab host: a module a local non-root user plants never runs as root.

`nobody` (a local user with no rights) writes json.py, torch.py and a sglang/ package into /tmp,
the folder the smoke runner used to start from; each would append to a marker file if imported.
`nobody` cannot write into the folder remote python starts from now (/var/lib/fleetspec/run, 0700).
A real deploy (smoke step included) and a status (the facts that run python) then leave no marker.
"""

from __future__ import annotations

import shlex

import pytest

from fleetspec.model import ledger as L
from tests.lab import reliability_lab as R

pytestmark = [pytest.mark.lab, pytest.mark.slow]

MARKER = "/var/tmp/fleetspec-planted-ran"
PLANT = f"import os; open({MARKER!r}, 'a').write(__name__ + ' ' + str(os.getuid()) + chr(10))\n"


@pytest.fixture(scope="session")
def rel(lab_fleet, tmp_path_factory):
    return R.rel_fixture(lab_fleet, tmp_path_factory)


def test_modules_planted_by_a_local_user_never_run_as_root(rel):
    host = rel.h1
    rel.ensure_baseline(host)
    lab = rel.lab
    plant = (f"cd /tmp && mkdir -p sglang && for m in json.py torch.py sglang/__init__.py; do "
             f"printf %s {shlex.quote(PLANT)} > \"$m\"; done")
    lab.sh(host, f"rm -f {MARKER}; runuser -u nobody -- sh -c {shlex.quote(plant)} && "
                 f"test \"$(stat -c %U /tmp/json.py)\" = nobody")
    try:
        assert lab.rc(host, "runuser -u nobody -- touch /var/lib/fleetspec/run/x") != 0
        R.fs(rel.root, "status", host, "--json", check_rc=0)
        lab.sh(host, "rm -rf /var/lib/fleetspec/smoke-verdicts")     # no verdict to replay: the tests run
        d = R.fs(rel.root, "deploy", host, "--algo", "ddtree", "--yes", "--no-gates")
        assert d.returncode == 0, (d.stdout[-2000:], d.stderr[-2000:])
        entries = L.parse(lab.sh(host, f"cat {R.STATE}/ledger.jsonl")).entries
        smoked = [e for e in entries if e.name == "smoke" and e.state == "ok"]
        assert smoked, "the deploy ran no smoke step"
        stage = next(e for e in entries if e.release == smoked[-1].release and e.name == "stage" and e.state == "ok")
        assert "smoke_reused" not in stage.detail, stage.detail
        assert lab.rc(host, f"test -e {MARKER}") != 0, lab.sh(host, f"cat {MARKER}")
        assert lab.sh(host, "stat -c '%a %U' /var/lib/fleetspec/run").split() == ["700", "root"]
        assert lab.rc(host, "runuser -u nobody -- ls /var/lib/fleetspec/run") != 0
    finally:
        lab.sh(host, f"rm -rf /tmp/json.py /tmp/torch.py /tmp/sglang {MARKER}", ok=False)
        R.fs(rel.root, "rollback", host)
    rel.assert_on_baseline(host)

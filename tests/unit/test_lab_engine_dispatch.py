"""The stand-in's start-up in each real sglang venv with the DDTree patch set overlaid: the real
parser, the patched `SpeculativeAlgorithm` dispatch (`create_worker`) picking the DDTree worker
class (which imports it and everything it imports), and the decode plan the deployed worker's own
rules give for the lab's host shapes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_patchset_apply import Host

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "fleetspec/lab/engine"
BASE = ["--model-path", "/models/target", "--speculative-draft-model-path", "/models/draft"]
DDTREE = [*BASE, "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "64",
          "--speculative-ddtree-topk-cap", "8"]
WORKER = {"0.5.13.post1": "sglang.srt.speculative.ddtree_worker.DDTreeWorker",
          "0.5.23": "fleetspec_ddtree.worker.DDTreeWorkerV2"}

SCRIPT = """
import json, sys
from fleetspec_lab_engine import args, decode
args.load_plugins()
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    parsed = args.parse(argv)
    worker = args.worker_class(parsed)
    plan = decode.make_plan(parsed.algorithm, parsed.values, worker)
    out[name] = {"algorithm": parsed.algorithm, **plan.as_dict()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=["0.5.13.post1", "0.5.23"])
def host(request, tmp_path_factory):
    return Host(request.param, tmp_path_factory.mktemp(f"dispatch-{request.param}"))


def plans(host, cases: dict) -> dict:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "PYTHONPATH": f"{host.overlay}:{ENGINE}"}
    out = subprocess.run([str(host.python), "-c", SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                         timeout=600, env=env, cwd="/")
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dispatch_picks_the_ddtree_worker_and_the_plan_follows_its_rules(host):
    got = plans(host, {
        "tree": [*DDTREE, "--tp-size", "1"],
        "shadow": [*DDTREE, "--tp-size", "1", "--speculative-ddtree-shadow-linear"],
        "tp2": [*DDTREE, "--tp-size", "2", "--speculative-ddtree-shadow-linear"],
        "dflash": [*BASE, "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "16"],
    })
    for case in ("tree", "shadow", "tp2"):
        assert got[case]["algorithm"] == "DDTREE" and got[case]["worker"] == WORKER[host.version], got[case]
    assert got["dflash"]["worker"].rsplit(".", 1)[1] in ("DFlashWorker", "DFlashWorkerV2")
    if host.version == "0.5.13.post1":
        assert (got["tree"]["verify_mode"], got["tree"]["builds_trees"]) == ("tree", True)
        assert (got["shadow"]["verify_mode"], got["shadow"]["builds_trees"]) == ("shadow-linear", True)
        assert (got["tp2"]["verify_mode"], got["tp2"]["builds_trees"]) == ("linear", False)
    else:       # 0.5.23's worker has no tree path: linear whatever the flags say
        assert {got[c]["verify_mode"] for c in ("tree", "shadow", "tp2")} == {"linear"}
        assert not any(got[c]["builds_trees"] for c in ("tree", "shadow", "tp2"))
    assert got["tree"]["sampling_verify_mode"] == "linear"

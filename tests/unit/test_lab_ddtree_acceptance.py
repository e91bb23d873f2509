"""DDTree acceptance in the stand-in comes from the real tree code (the payload), and beats the
chain drafters built from the same draft logits: DDTree > DFlash > NEXTN > none."""

import importlib.util
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = ROOT / "playbooks/ddtree/payload/ddtree_utils.py"


@pytest.fixture
def tree_verifier(monkeypatch):
    if not PAYLOAD.exists():
        pytest.skip("the DDTree payload is not in this checkout")
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    name = "sglang.srt.speculative.ddtree_utils"
    spec = importlib.util.spec_from_file_location(name, PAYLOAD)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    from fleetspec.lab.engine.fleetspec_lab_engine import model

    return model, model.TreeVerifier(64, 8, 15)


def test_tree_beats_chain_beats_nextn(tree_verifier):
    model, tv = tree_verifier
    n = 120
    tree = chain = nextn = 0
    for s in range(n):
        ranks = model.draft_ranks(s, 15, "DDTREE", 0)
        target = model.Target([s])
        truth = target.continuation(target.state, 15)
        got = tv.accept(truth, ranks, 64, s)
        assert got >= model.chain_accept(ranks)  # the tree contains the chain
        tree += got
        chain += model.chain_accept(ranks)
        nextn += model.chain_accept(model.draft_ranks(s, 3, "EAGLE", 0))
    assert tree > chain * 1.1 and chain > nextn > 0

"""The engine stand-in's pure parts: the import redirect and the synthetic models."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fleetspec.lab import engine
from fleetspec.lab.engine.fleetspec_lab_engine import model


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    for rel, data in engine.files().items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    return site


def test_redirect_wins_over_an_overlay_sglang(tmp_path):
    """With an overlay copy of sglang first on PYTHONPATH, sglang comes from the overlay but
    sglang.launch_server is the stand-in."""
    site = _site(tmp_path)
    overlay = tmp_path / "overlay" / "sglang"
    overlay.mkdir(parents=True)
    (overlay / "__init__.py").write_text("WHERE = 'overlay'\n")
    (overlay / "launch_server.py").write_text("raise SystemExit('the real launcher ran')\n")
    code = textwrap.dedent(f"""
        import site, importlib.util
        site.addsitedir({str(site)!r})
        import sglang
        print(sglang.WHERE, importlib.util.find_spec("sglang.launch_server").origin)
    """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "overlay")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    where, origin = out.split()
    assert where == "overlay" and origin.endswith("fleetspec_lab_engine/launch_server.py")
    env["FLEETSPEC_LAB_ENGINE"] = "off"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[1].endswith("overlay/sglang/launch_server.py")


def test_target_depends_on_the_context_as_a_set_of_position_token_pairs():
    """A sequence and the same (position, token) pairs folded in any order give one digest; one
    extra pair at an existing position (a leaked sibling) or a shifted position gives another."""
    seq = model.Sequence([5, 9, 2])
    pairs = [(0, 5), (1, 9), (2, 2)]
    assert model.fold_pairs(model.START, reversed(pairs)) == seq.digests[-1]
    assert model.fold_pairs(model.START, pairs + [(2, 7)]) != seq.digests[-1]
    assert model.fold_pairs(model.START, [(0, 5), (1, 9), (3, 2)]) != seq.digests[-1]
    lm = model.TargetLM()
    assert lm.logits([seq.digests[-1]]).equal(lm.logits([seq.digests[-1]]))

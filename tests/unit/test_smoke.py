"""Smoke-script builders, run for real with this machine's python and torch against a minimal
sglang package that holds only the shipped DDTree payload (the real-parser runs are in
test_patchset_apply.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetspec.remote import smoke_host as smoke

pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site")
    pkg = root / "sglang/srt/speculative"
    pkg.mkdir(parents=True)
    for init in (root / "sglang", root / "sglang/srt", pkg):
        (init / "__init__.py").write_text("")
    for name in ("ddtree_utils.py", "ddtree_config.py"):
        shutil.copyfile(REPO / "playbooks/ddtree/payload" / name, pkg / name)
    return root


def _run(source: str, path: Path) -> tuple[int, smoke.SmokeResult]:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(path)}
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env,
                         timeout=120, cwd="/")
    return out.returncode, smoke.parse_result(out.stdout)


def test_imports_report_files_and_failures(tree):
    rc, result = _run(smoke.imports_script(["sglang.srt.speculative.ddtree_utils", "no_such_module_x"]), tree)
    assert rc == 1 and not result.ok
    assert result.data["modules"]["sglang.srt.speculative.ddtree_utils"].startswith(str(tree))
    assert "no_such_module_x" in result.error


def test_ddtree_sample_passes_on_the_payload(tree):
    rc, result = _run(smoke.ddtree_sample_script(budget=24, topk_cap=4), tree)
    assert rc == 0 and result.ok, result.data
    assert all(result.data["checks"].values()) and result.data["summary"]["sizes"] == [25, 25]


def test_ddtree_sample_fails_a_biased_sampling_walk(tree, tmp_path):
    """The real worker verifies linearly whenever sampling is not greedy, so no gate's generation
    ever runs verify_sampling; this distribution check in the smoke test is what catches it."""
    from tests.ddtree_mutations import mutate

    bad = tmp_path / "site"
    shutil.copytree(tree, bad)
    target = bad / "sglang/srt/speculative/ddtree_utils.py"
    target.write_text(mutate(target.read_text(), "sampling_biased"))
    rc, result = _run(smoke.ddtree_sample_script(budget=24, topk_cap=4), bad)
    assert rc == 1 and not result.ok and result.error == "sampling_distribution", result.data
    rc, good = _run(smoke.ddtree_sample_script(budget=24, topk_cap=4), tree)
    assert good.ok and good.data["sampling_chi2"] < 20 < result.data["sampling_chi2"], (good.data, result.data)


def test_kernel_smoke_loads_the_build_and_compares(tree):
    from fleetspec.build.kernel import build_kernel

    kernel, _ = build_kernel(REPO / "playbooks/ddtree/kernels/tree_mask")
    rc, result = _run(smoke.kernel_script(str(kernel.path)), tree)
    assert rc == 0 and result.ok, result.data
    rc, result = _run(smoke.kernel_script("/nonexistent/tree_mask.so"), tree)
    assert rc == 1 and "loading" in result.error


def test_parse_result_needs_a_json_line():
    assert not smoke.parse_result("Traceback ...\nKeyError: x\n").ok
    assert smoke.parse_result('noise\n{"ok": true, "x": 1}\n').data["x"] == 1
    assert not smoke.parse_result('{"ok": false, "error": "e"}').ok
    assert not smoke.parse_result("{broken").ok


def test_parse_args_script_is_plain_python():
    compile(smoke.parse_args_script(["--model-path", "x", "--speculative-algorithm", "DDTREE"]), "<smoke>", "exec")

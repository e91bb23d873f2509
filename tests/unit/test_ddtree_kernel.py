"""The fused top-k / log-normaliser kernel (fleetspec_ddtree::topk_logprobs), built for real with
this machine's torch: it and the payload's torch fallback give the same candidates and the same
trees (ties and -inf included), the payload finds the release's library by itself and says which
path ran, and the smoke scripts fail a required kernel that does not load but let an optional
one fall back with a note."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fleetspec.build import kernel as KB
from fleetspec.model import payload
from fleetspec.ops.smoke_run import kernel_path
from fleetspec.remote import smoke_host as smoke

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "playbooks/ddtree/kernels/tree_mask"
PAYLOAD = REPO / "playbooks/ddtree/payload"


def _payload(name: str):
    return payload.load("ddtree_utils", name)


@pytest.fixture(scope="module")
def built():
    # The default cache, as in test_kernel.py: one process must load one copy of the library only
    # (two copies of one TORCH_LIBRARY abort the process).
    kernel, _ = KB.build_kernel(SOURCE)
    return kernel


@pytest.fixture(scope="module")
def du(built):
    module = _payload("ddtree_utils_kernel_test")
    status = module.load_kernel(built.path)
    assert status["loaded"] and "cpu" in status["devices"], status
    return module


def _reference(x: torch.Tensor, k: int):
    """Brute force: a stable descending sort of every row (ties: lower id first), then logsumexp."""
    logits = x.float()
    values, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return (values[..., :k] - torch.logsumexp(logits, dim=-1, keepdim=True)), ids[..., :k]


def _cases():
    g = torch.Generator().manual_seed(7)
    rand = torch.randn(3, 5, 4099, generator=g) * 3
    ties = (torch.randn(2, 6, 777, generator=g) * 1.5).round()          # many equal values per row
    flat = torch.zeros(2, 3, 50)                                           # every value tied
    minf = torch.randn(3, 4, 300, generator=g)
    minf[0, 0] = float("-inf")                                             # a row of -inf only
    minf[1, :, 5:] = float("-inf")                                         # fewer finite values than k
    minf[2, 1, ::2] = float("-inf")
    big = torch.randn(1, 2, 151_936, generator=g) * 3                      # Qwen's vocabulary
    return [("random", rand, 64), ("random-k1", rand, 1), ("ties", ties, 40), ("ties-all", ties, 777),
            ("flat", flat, 7), ("-inf", minf, 10), ("-inf-all", minf, 300), ("bf16", rand.bfloat16(), 64),
            ("half", ties.half(), 33), ("double", rand.double(), 16), ("vocab", big, 64)]


@pytest.mark.parametrize("name, x, k", _cases(), ids=[c[0] for c in _cases()])
def test_kernel_and_fallback_equal_a_stable_sort(du, name, x, k):
    want_v, want_i = _reference(x, k)
    got_v, got_i, path = du._candidates(x, k, use_kernel=True)
    assert path == "kernel:cpu"
    fb_v, fb_i, fb_path = du._candidates(x, k, use_kernel=False)
    assert fb_path == "torch:cpu"
    assert torch.equal(got_i, want_i), f"{name}: kernel ids differ from the stable sort"
    assert torch.equal(fb_i, want_i), f"{name}: fallback ids differ from the stable sort"
    assert got_v.dtype == torch.float32 and got_v.shape == want_v.shape
    # log_z is summed in a different order: the two differ at most in float32 rounding
    assert torch.allclose(got_v, fb_v, rtol=0, atol=4e-6, equal_nan=True)
    assert torch.equal(got_v.isnan(), fb_v.isnan()) and torch.equal(got_v.isneginf(), fb_v.isneginf())


def test_trees_are_identical_with_and_without_the_kernel(du):
    g = torch.Generator().manual_seed(11)
    shapes = [(4, 15, 2048, 64, None), (3, 7, 1000, 32, 4), (2, 3, 5, 40, None), (2, 9, 512, 100, 8),
              (1, 15, 151_936, 64, None), (5, 4, 64, 16, 1)]
    checked = 0
    for batch, depth, vocab, budget, cap in shapes:
        for variant in ("normal", "ties", "minf", "bf16"):
            x = torch.randn(batch, depth, vocab, generator=g) * 3
            if variant == "ties":
                x = x.round()
            elif variant == "minf":
                x[:, -1, vocab // 3:] = float("-inf")
                x[0, 1] = float("-inf")
            elif variant == "bf16":
                x = x.bfloat16()
            a = du.build_ddtree(x, budget, cap, use_kernel=True)
            b = du.build_ddtree(x, budget, cap, use_kernel=False)
            assert (a.candidates, b.candidates) == ("kernel:cpu", "torch:cpu")
            for field in ("tokens", "parents", "depth", "valid"):
                assert torch.equal(getattr(a, field), getattr(b, field)), (variant, batch, depth, vocab, field)
            assert torch.allclose(a.scores, b.scores, rtol=0, atol=1e-4)
            checked += 1
    assert checked == len(shapes) * 4


def test_auto_uses_the_kernel_and_the_summary_says_so(du):
    x = torch.randn(2, 4, 100, generator=torch.Generator().manual_seed(0))
    tree = du.build_ddtree(x, 16, 4)
    assert tree.candidates == "kernel:cpu" and du.tree_summary(tree)["candidates"] == "kernel:cpu"
    assert du.kernel_status()["loaded"] is True


def test_required_kernel_for_an_unsupported_device_raises(du):
    with pytest.raises(RuntimeError, match="not loaded for meta"):
        du._candidates(torch.empty(1, 2, 5, device="meta"), 2, use_kernel=True)


def test_bad_k_is_refused_by_the_op(du):
    with pytest.raises(RuntimeError, match="k must be in"):
        torch.ops.fleetspec_ddtree.topk_logprobs(torch.zeros(2, 5), 6)


# The release layout: the payload finds releases/<id>/kernels by itself (in a child process each,
# so this one never loads a second copy of the library).
def _release(tmp_path: Path, built, with_library: bool = True) -> Path:
    rel = tmp_path / "releases" / "r1"
    pkg = rel / "overlay/sglang/srt/speculative"
    pkg.mkdir(parents=True)
    for init in (rel / "overlay/sglang", rel / "overlay/sglang/srt", pkg):
        (init / "__init__.py").write_text("")
    for name in ("ddtree_utils.py", "ddtree_config.py"):
        shutil.copyfile(PAYLOAD / name, pkg / name)
    (rel / "kernels").mkdir()
    if with_library:
        shutil.copyfile(built.path, rel / "kernels" / built.library_file)
    return rel


_PROBE = """
import json, torch
from sglang.srt.speculative import ddtree_utils as du
tree = du.build_ddtree(torch.randn(2, 3, 50), 8, None)
print(json.dumps({"status": du.kernel_status(), "candidates": tree.candidates}))
"""


def _probe(rel: Path, **env) -> dict:
    full = {"PATH": os.environ["PATH"], "PYTHONPATH": str(rel / "overlay"), **env}
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=full, timeout=120,
                         cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_payload_loads_the_release_library_and_falls_back_without_it(tmp_path, built):
    rel = _release(tmp_path, built)
    seen = _probe(rel)
    assert seen["candidates"] == "kernel:cpu" and seen["status"]["loaded"]
    assert seen["status"]["library"] == str((rel / "kernels/tree_mask.so").resolve())
    off = _probe(rel, FLEETSPEC_DDTREE_KERNEL="off")
    assert off["candidates"] == "torch:cpu" and not off["status"]["loaded"]
    (rel / "kernels/tree_mask.so").unlink()
    gone = _probe(rel)
    assert gone["candidates"] == "torch:cpu" and not gone["status"]["loaded"]
    assert "tree_mask.so" in gone["status"]["error"]
    # The drop-in's FLEETSPEC_KERNELS wins over the overlay's neighbour folder.
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copyfile(built.path, other / "tree_mask.so")
    assert _probe(rel, FLEETSPEC_KERNELS=str(other))["status"]["library"] == str(other / "tree_mask.so")


def _smoke(source: str, rel: Path) -> tuple[int, smoke.SmokeResult]:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(rel / "overlay")}
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=120, cwd="/")
    return out.returncode, smoke.parse_result(out.stdout)


def test_smoke_kernel_check_compares_both_ops(tmp_path, built):
    rel = _release(tmp_path, built)
    rc, result = _smoke(smoke.kernel_script(str(rel / "kernels/tree_mask.so"), required=True), rel)
    assert rc == 0 and result.ok, result.data
    assert result.data["checks"] == {"tree_mask": True, "topk_logprobs": True, "same_tree": True}
    rc, result = _smoke(smoke.ddtree_sample_script(kernel_required=True), rel)
    assert rc == 0 and result.ok and result.data["candidates"] == "kernel:cpu", result.data


def test_the_kernel_smoke_fails_a_library_whose_log_probs_are_off(tmp_path):
    """A build whose log_z is off by 2e-4 (ids and trees still right) fails the smoke on
    topk_logprobs: held to float64's log-probs, the kernel's deviation shows, torch's does not."""
    source = tmp_path / "tree_mask"
    shutil.copytree(SOURCE, source)
    cpp = source / "topk_logprobs.cpp"
    assert cpp.read_text().count("std::log(s)") == 1
    cpp.write_text(cpp.read_text().replace("std::log(s)", "std::log(s * 1.0002)"))
    off, _ = KB.build_kernel(source, cache=tmp_path / "cache", cuda=False)
    rel = _release(tmp_path, off)
    rc, result = _smoke(smoke.kernel_script(str(rel / "kernels" / off.library_file), required=True), rel)
    assert rc == 1 and not result.ok and result.error == "kernel differs from the payload's torch code: topk_logprobs"
    assert result.data["checks"] == {"tree_mask": True, "topk_logprobs": False, "same_tree": True}, result.data
    deviation = result.data["logprob_deviation"]
    assert 1e-4 < deviation["kernel"] < 1e-3 and deviation["torch"] < 1e-5, deviation


def test_a_missing_library_fails_a_required_kernel_and_is_a_note_for_an_optional_one(tmp_path, built):
    rel = _release(tmp_path, built, with_library=False)
    library = str(rel / "kernels/tree_mask.so")
    rc, required = _smoke(smoke.kernel_script(library, required=True), rel)
    assert rc == 1 and not required.ok and "tree_mask.so" in required.error
    rc, optional = _smoke(smoke.kernel_script(library, required=False), rel)
    assert rc == 0 and optional.ok and optional.data["fallback"] is True
    rc, sample = _smoke(smoke.ddtree_sample_script(kernel_required=True), rel)
    assert rc == 1 and "kernel is required" in sample.error and "torch:cpu" in sample.error
    rc, sample = _smoke(smoke.ddtree_sample_script(kernel_required=False), rel)
    assert rc == 0 and sample.data["candidates"] == "torch:cpu"
    detail = kernel_path({"kernel:tree_mask.so": {**optional.data, "ok": True}, "ddtree_sample": sample.data})
    assert detail["candidates"] == "torch:cpu" and "torch fallback" in detail["kernel_note"]
    assert "kernel_note" not in kernel_path({"ddtree_sample": {"candidates": "kernel:cpu"}})


_ENGINE_PROBE = """
import json, sys
from sglang.srt.speculative import ddtree_utils  # noqa: F401  (sglang imports it when DDTREE is on)
from fleetspec_lab_engine.server import ddtree_kernel_info
print(json.dumps(ddtree_kernel_info()))
"""


def test_the_engine_log_and_the_lab_server_info_say_which_path_runs(tmp_path, built):
    rel = _release(tmp_path, built, with_library=False)
    engine = REPO / "fleetspec/lab/engine"

    def run(kernels: Path) -> tuple[str, dict]:
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{rel / 'overlay'}:{engine}", "FLEETSPEC_KERNELS": str(kernels)}
        out = subprocess.run([sys.executable, "-c", _ENGINE_PROBE], capture_output=True, text=True, env=env,
                             timeout=120, cwd="/")
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stderr, json.loads(out.stdout.strip().splitlines()[-1])["ddtree_kernel"]

    shutil.copyfile(built.path, tmp_path / "tree_mask.so")
    log, info = run(tmp_path)
    assert f"fleetspec_ddtree: kernel:cpu from {tmp_path / 'tree_mask.so'}\n" in log
    assert info["loaded"] and info["line"] == log.strip().splitlines()[-1]
    log, info = run(tmp_path / "absent")
    assert "fleetspec_ddtree: torch fallback (OSError" in log and "absent/tree_mask.so" in log
    assert not info["loaded"] and info["line"].startswith("fleetspec_ddtree: torch fallback")

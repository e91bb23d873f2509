"""The tree_mask kernel: built for real with this machine's torch, checked against the Python
reference, and refused by check_abi wherever the host's ABI facts differ."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fleetspec.build import kernel as KB
from fleetspec.errors import ConfigError, UserError
from fleetspec.model import kernel as K
from fleetspec.model import payload
from fleetspec.remote.facts import torch as torch_fact

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "playbooks/ddtree/kernels/tree_mask"


def _ddtree_utils():
    return payload.load("ddtree_utils", "ddtree_utils_for_kernel")


@pytest.fixture(scope="module")
def built():
    kernel, _ = KB.build_kernel(SOURCE)  # cached under /var/cache/fleetspec/kernels after the first build
    return kernel


def _local_facts() -> torch_fact.TorchInfo:
    """This machine's torch as the torch fact reports it (run once: importing torch is slow)."""
    global LOCAL
    if LOCAL is None:
        out = subprocess.run([sys.executable, "-c", torch_fact.SNIPPET], capture_output=True, text=True, check=True)
        LOCAL = torch_fact.parse(out.stdout)
    return LOCAL


LOCAL = None


def test_kernel_json_records_the_abi_tags(built):
    data = json.loads((built.spec.root / "kernel.json").read_text())["build"]
    assert data["torch"] == torch.__version__ and data["python_tag"] == "cp%d%d" % sys.version_info[:2]
    assert data["cuda"] == "cpu" and data["cxx11_abi"] == bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert data["platform"].startswith("linux") and len(data["sha256"]) == 64
    assert built.source_sha256 == K.load_spec(SOURCE).source_sha256()
    assert built.file_bytes()[built.library_file][:4] == b"\x7fELF"


def test_kernel_equals_the_python_reference(built):
    du = _ddtree_utils()
    torch.ops.load_library(str(built.path))
    for seed, (batch, depth, vocab, budget, cap) in enumerate([(3, 6, 50, 20, 4), (2, 15, 300, 64, 8), (4, 2, 2, 9, None)]):
        tree = du.build_ddtree(torch.randn(batch, depth, vocab, generator=torch.Generator().manual_seed(seed)), budget, cap)
        assert torch.equal(torch.ops.fleetspec_ddtree.tree_mask(tree.parents), du.visibility_mask(tree))
    cyclic = torch.tensor([[1, 0, -1]])
    assert torch.ops.fleetspec_ddtree.tree_mask(cyclic).shape == (1, 3, 3)  # terminates


def test_check_abi_accepts_this_machine(built):
    K.check_abi(built, _local_facts(), host="local")
    K.check_abi(built, {"python_tag": built.abi.python_tag, "torch": torch.__version__, "cuda": None,
                        "cxx11_abi": built.abi.cxx11_abi, "platform": built.abi.platform})


def _rebuilt_for(built, tmp_path, **build) -> K.Kernel:
    folder = tmp_path / "other"
    shutil.copytree(built.spec.root, folder)
    data = json.loads((folder / "kernel.json").read_text())
    data["build"].update(build)
    (folder / "kernel.json").write_text(json.dumps(data))
    return K.load_kernel(folder)


def test_a_kernel_for_another_torch_is_refused_naming_both_versions(built, tmp_path):
    other = _rebuilt_for(built, tmp_path, torch="2.11.0+cu128", cuda="12.8")
    with pytest.raises(UserError) as err:
        K.check_abi(other, _local_facts(), host="ct129")
    msg = str(err.value)
    assert "2.11.0+cu128" in msg and torch.__version__ in msg and "ct129" in msg and "\n" not in msg


@pytest.mark.parametrize("field, value, label", [
    ("python_tag", "cp312", "python"), ("cxx11_abi", False, "C++11 ABI"), ("platform", "linux_aarch64", "platform")])
def test_other_abi_tags_are_refused(built, tmp_path, field, value, label):
    other = _rebuilt_for(built, tmp_path, **{field: value})
    with pytest.raises(UserError, match=re.escape(f"built for {label} ")):
        K.check_abi(other, {**K.host_abi(_local_facts()), "platform": built.abi.platform})


def test_gpu_arch_must_be_in_the_build(built, tmp_path):
    other = _rebuilt_for(built, tmp_path, cuda="12.8", torch="2.11.0+cu128", arch_list=["8.0", "9.0+PTX"])
    facts = {"python_tag": other.abi.python_tag, "torch": "2.11.0+cu128", "cuda": "12.8",
             "cxx11_abi": other.abi.cxx11_abi, "gpu_arch": ["9.0"]}
    K.check_abi(other, facts)
    with pytest.raises(UserError, match="GPU arch 8.0, 9.0\\+PTX; the host has 10.0"):
        K.check_abi(other, {**facts, "gpu_arch": ["10.0"]})


def test_a_host_without_torch_is_refused(built):
    with pytest.raises(UserError, match="has no torch"):
        K.check_abi(built, {"python_tag": "cp311", "torch": None})


def test_find_built_kernel_prefers_the_hosts_torch(built, tmp_path):
    cache = tmp_path / "cache"
    spec = K.load_spec(SOURCE)
    mine = cache / built.spec.root.name
    shutil.copytree(built.spec.root, mine)
    theirs = cache / f"{spec.name}-{spec.source_sha256()[:16]}-cp311-torch2.11.0+cu128"
    shutil.copytree(built.spec.root, theirs)
    data = json.loads((theirs / "kernel.json").read_text())
    data["build"]["torch"] = "2.11.0+cu128"
    (theirs / "kernel.json").write_text(json.dumps(data))
    assert K.find_built_kernel(SOURCE, {"torch": "2.11.0+cu128"}, cache).abi.torch == "2.11.0+cu128"
    assert K.find_built_kernel(SOURCE, _local_facts(), cache).abi.torch == torch.__version__
    with pytest.raises(UserError, match="has no build"):
        K.find_built_kernel(SOURCE, _local_facts(), tmp_path / "empty")


def test_a_changed_library_is_caught(built, tmp_path):
    other = _rebuilt_for(built, tmp_path)
    other.path.write_bytes(b"not the build")
    with pytest.raises(ConfigError, match="build.sha256"):
        other.file_bytes()


def test_source_folder_needs_a_build_record():
    with pytest.raises(ConfigError, match="fleetspec kernels build"):
        K.load_kernel(SOURCE)
    assert K.load_spec(SOURCE).op_names == ("fleetspec_ddtree::tree_mask", "fleetspec_ddtree::topk_logprobs")

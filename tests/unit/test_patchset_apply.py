"""Each patch set applied to its real sglang install (a symlink-farm overlay built by the release
script) and that version's real parser run on the DDTree argv, in the version's own venv."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetspec.build.patchset import load_patchset
from fleetspec.errors import UserError
from fleetspec.model.patchset import check_base
from fleetspec.remote import smoke_host as smoke
from fleetspec.remote.overlay import overlay_script

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("0.5.13.post1", "0.5.23")
ARGV = ["--model-path", "/models/target", "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", "/models/draft", "--speculative-ddtree-budget", "32",
        "--speculative-ddtree-topk-cap", "8", "--speculative-ddtree-shadow-linear"]
WORKER = {"0.5.13.post1": "sglang.srt.speculative.ddtree_worker", "0.5.23": "fleetspec_ddtree.worker"}
BASE_WORKER = {"0.5.13.post1": "sglang.srt.speculative.dflash_worker", "0.5.23": "sglang.srt.speculative.dflash_worker_v2"}


class Host:
    """One version's venv with a release overlay, as a host would have it."""

    def __init__(self, version: str, tmp: Path):
        from fleetspec.lab.envs import local_env, site_packages

        self.version = version
        self.python = local_env(version)
        self.site = site_packages(self.python.parent.parent)
        self.patchset = load_patchset(REPO / f"playbooks/ddtree/patches/sglang-{version}")
        self.overlay = tmp / "overlay"
        script = overlay_script(str(self.site), str(self.patchset.files_dir), str(self.overlay), self.patchset)
        built = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stderr

    def run(self, source: str, overlay: bool = True, **env) -> smoke.SmokeResult:
        environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **env}
        if overlay:
            environ["PYTHONPATH"] = str(self.overlay)
        out = subprocess.run([str(self.python), "-c", source], capture_output=True, text=True,
                             timeout=300, env=environ, cwd="/")
        result = smoke.parse_result(out.stdout)
        assert result.ok == (out.returncode == 0), out.stderr[-3000:]
        return result

    def installed_hashes(self, site: Path | None = None) -> dict[str, str]:
        site = site or self.site
        return {f.path: hashlib.sha256((site / f.path).read_bytes()).hexdigest()
                for f in self.patchset.files if (site / f.path).is_file()}


@pytest.fixture(scope="module", params=VERSIONS)
def host(request, tmp_path_factory):
    return Host(request.param, tmp_path_factory.mktemp(f"host-{request.param}"))


def test_the_real_parser_accepts_the_ddtree_argv(host):
    result = host.run(smoke.parse_args_script(ARGV))
    assert result.ok, result.data
    assert result.data["speculative_algorithm"] == "DDTREE"
    assert result.data["ddtree"] == {"budget": 32, "topk_cap": 8, "shadow_linear": True}
    assert result.data["server_args_file"].startswith(str(host.overlay))
    assert result.data["sglang_version"] == host.version


@pytest.mark.parametrize("bad", ["0", "-1", "many"])
def test_the_real_parser_rejects_a_bad_budget_clearly(host, bad):
    argv = ARGV[:ARGV.index("--speculative-ddtree-budget") + 1] + [bad]
    result = host.run(smoke.parse_args_script(argv))
    assert not result.ok and result.data["exit_code"] == 2
    assert "argument --speculative-ddtree-budget: expected an integer >= 1" in result.error


def test_without_the_overlay_the_flags_are_unknown(host):
    result = host.run(smoke.parse_args_script(ARGV), overlay=False)
    assert not result.ok and result.data["exit_code"] == 2 and "unrecognized arguments" in result.error


def test_payload_imports_cleanly_on_cpu(host):
    modules = ["sglang.srt.speculative.ddtree_utils", "sglang.srt.speculative.ddtree_config"]
    result = host.run(smoke.imports_script(modules))
    assert result.ok, result.data
    assert all(path.startswith(str(host.overlay)) for path in result.data["modules"].values())


def test_gpu_worker_and_its_dflash_base_import(host):
    """The lab venvs carry what the speculative workers import (envs.WORKER_DEPS): DFlash's worker
    and the DDTree worker both import on CPU, so the lab runs every line of their module level."""
    ours = host.run(smoke.imports_script([WORKER[host.version]]))
    base = host.run(smoke.imports_script([BASE_WORKER[host.version]]))
    assert base.ok, base.data
    assert ours.ok, ours.data
    assert ours.data["modules"][WORKER[host.version]].startswith(str(host.overlay))


def test_ddtree_sample_runs_with_the_hosts_torch(host):
    result = host.run(smoke.ddtree_sample_script(budget=16, topk_cap=4))
    assert result.ok, result.data
    assert result.data["summary"]["sizes"] == [17, 17]


def test_the_hybrid_guard_runs_in_the_shipped_config(host, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "full_attention_interval": 4}))
    source = smoke._EMIT + f'''
from sglang.srt.speculative.ddtree_config import check_ddtree_args
try:
    check_ddtree_args(algorithm="DDTREE", budget=8, topk_cap=None, shadow_linear=False, model_path={str(tmp_path)!r})
except ValueError as err:
    shadow = check_ddtree_args(algorithm="DDTREE", budget=8, topk_cap=None, shadow_linear=True, model_path={str(tmp_path)!r})
    _emit(True, refused=str(err), shadow=shadow)
_emit(False, error="a hybrid target was accepted without shadow-linear")
'''
    result = host.run(source)
    assert result.ok and "hybrid target" in result.data["refused"] and result.data["shadow"]["shadow_linear"]


def test_the_installed_base_passes_and_the_other_version_is_refused(host):
    check_base(host.patchset, host.version, host.installed_hashes())
    other = load_patchset(REPO / f"playbooks/ddtree/patches/sglang-{[v for v in VERSIONS if v != host.version][0]}")
    with pytest.raises(UserError, match=f"sglang=={host.version} is installed on the host"):
        check_base(other, host.version, host.installed_hashes())


def test_a_changed_base_file_is_refused_with_its_name(host, tmp_path):
    if not host.patchset.replaced:
        pytest.skip("this patch set replaces no file (a plugin); its base check is the version and absent paths")
    site = tmp_path / "site"
    for entry in host.patchset.replaced:
        (site / entry.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(host.site / entry.path, site / entry.path)
    drifted = host.patchset.replaced[-1].path
    with open(site / drifted, "a") as fh:
        fh.write("# hand-patched on the host\n")
    with pytest.raises(UserError) as err:
        check_base(host.patchset, host.version, host.installed_hashes(site))
    assert str(err.value).startswith(f"{drifted} on the host differs from sglang=={host.version}")


def test_the_plugin_entry_point_is_found_through_pythonpath(host, tmp_path):
    if not host.patchset.extra_top_level:
        pytest.skip("no plugin in this patch set")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nemotron_h"}))
    argv = [str(tmp_path) if a == "/models/target" else a for a in ARGV if a != "--speculative-ddtree-shadow-linear"]
    source = smoke._EMIT + f"ARGV = {argv!r}\n" + '''
import importlib.metadata as m
eps = {e.name: e.value for e in m.entry_points(group="sglang.srt.plugins")}
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.speculative.spec_registry import get_spec
spec = get_spec("DDTREE")
import pickle
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(ARGV)
copy = pickle.loads(pickle.dumps(args))  # what a worker process receives
try:
    spec.validate_server_args(copy)
    guard = "accepted"
except ValueError as err:
    guard = str(err)
_emit(spec is not None and eps.get("ddtree") == "fleetspec_ddtree:register", entry_points=eps,
      spec=repr(spec), is_dflash=bool(spec and spec.is_dflash()),
      pickled_budget=copy.speculative_ddtree_budget, guard=guard)
'''
    result = host.run(source)
    assert result.ok and result.data["is_dflash"], result.data
    assert result.data["pickled_budget"] == 32 and "hybrid target" in result.data["guard"]
    assert not host.run(source, overlay=False).ok

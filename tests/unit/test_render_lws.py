"""`fleetspec render --lws` on published LeaderWorkerSet manifests of SGLang (tests/fixtures/k8s,
sources in its README): each is patched exactly (leader and worker: the derived argv, the
playbook's env, the release's initContainer, emptyDir and mount; every original line kept, in
order) and validates against LWS's own CRD schema (jsonschema on its openAPIV3Schema) and the core
kinds' schemas (kubernetes-validate, offline: its package carries them), or is refused in one line
for a reason the manifest has. Run as the real CLI in a child process."""

from __future__ import annotations

import difflib
import gzip
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fixtures" / "k8s"
PATCHED = ["lws-sglang.yaml", "lws-basic-sglang.yaml", "lws-autoscaling-sglang.yaml", "lws-topology-sglang.yaml",
           "sglang-lws-pd-prefill.yaml"]
IMAGE = "registry.example/fleetspec-release:ddtree-0.5.23-1"
ARGS = ["--algo", "ddtree", "--sglang", "0.5.23", "--var", "draft_model_path=/models/draft", "--release-image", IMAGE]
K8S = "1.33"     # the Kubernetes schema version kubernetes-validate checks core kinds against


def render(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetspec", "--root", str(REPO), "render", "--lws", str(path),
                           *args], capture_output=True, text=True, timeout=120, cwd=REPO)


@cache
def crd_schema() -> dict:
    crd = yaml.safe_load(gzip.decompress((CORPUS / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz").read_bytes()))
    assert crd["spec"]["group"] == "leaderworkerset.x-k8s.io"
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


def validate(docs: list) -> None:
    """LWS documents against the CRD; their pod templates (as PodTemplates) and every other
    document against the core schemas, strictly (no unknown fields)."""
    for doc in docs:
        if doc["kind"] == "LeaderWorkerSet":
            jsonschema.validate(doc, crd_schema())
            for role, template in doc["spec"]["leaderWorkerTemplate"].items():
                if role.endswith("Template") and isinstance(template, dict):
                    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                                  "metadata": {"name": role.lower()}, "template": template},
                                                 K8S, strict=True)
        else:
            kubernetes_validate.validate(doc, K8S, strict=True)


@pytest.mark.parametrize("name", PATCHED)
def test_published_manifest_is_patched_exactly_and_validates(name):
    path = CORPUS / name
    before = path.read_text()
    validate(list(yaml.safe_load_all(before)))            # the published file itself validates
    r = render(path, *ARGS)
    assert r.returncode == 0, r.stderr
    after = r.stdout
    # every original line is still there, in order: the patch only adds lines
    ops = difflib.SequenceMatcher(a=before.splitlines(), b=after.splitlines(), autojunk=False).get_opcodes()
    assert all(op in ("equal", "insert") for op, *_ in ops), [o for o in ops if o[0] != "equal"]
    docs = list(yaml.safe_load_all(after))
    validate(docs)
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    old = next(d for d in yaml.safe_load_all(before) if d["kind"] == "LeaderWorkerSet")
    for role in ("leaderTemplate", "workerTemplate"):
        spec, was = lws["spec"]["leaderWorkerTemplate"][role]["spec"], old["spec"]["leaderWorkerTemplate"][role]["spec"]
        c = spec["containers"][0]
        argv = c["command"]
        assert argv[:len(was["containers"][0]["command"])] == was["containers"][0]["command"]   # kept as it was
        added = argv[len(was["containers"][0]["command"]):]
        assert added[:8] == ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/models/draft",
                             "--speculative-ddtree-budget", "64", "--speculative-ddtree-topk-cap", "8"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["SGLANG_DDTREE_LOG"] == "0" and env["PYTHONPATH"] == "/opt/fleetspec/release/overlay"
        assert {"name": "fleetspec-release", "mountPath": "/opt/fleetspec/release", "readOnly": True} in c["volumeMounts"]
        assert spec["initContainers"][-1]["image"] == IMAGE and spec["volumes"][-1] == {
            "name": "fleetspec-release", "emptyDir": {}}
        assert c["image"] == was["containers"][0]["image"]                  # the image never changes
        assert {k: v for k, v in spec.items() if k not in ("containers", "initContainers", "volumes")} == {
            k: v for k, v in was.items() if k not in ("containers", "initContainers", "volumes")}


def test_a_speculative_baseline_loses_its_group_and_env_with_comments_kept(tmp_path):
    """NEXTN on the published example: the speculative items and SGLANG_ENABLE_SPEC_V2 go, the
    derived flags take their place, every other line (the comment on --tp too) stays."""
    text = (CORPUS / "lws-sglang.yaml").read_text()
    spec = ("              - --speculative-algorithm\n              - NEXTN\n"
            "              - --speculative-num-steps\n              - \"3\"\n")
    text = text.replace("              - --trust-remote-code\n", "              - --trust-remote-code\n" + spec)
    text = text.replace("              - name: HF_TOKEN\n                value: $HF_TOKEN\n",
                        "              - name: HF_TOKEN\n                value: $HF_TOKEN\n"
                        "              - name: SGLANG_ENABLE_SPEC_V2\n                value: \"1\"\n")
    path = tmp_path / "lws.yaml"
    path.write_text(text)
    r = render(path, *ARGS, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    after = out["manifest"]
    removed = [line for line in difflib.ndiff(text.splitlines(), after.splitlines()) if line.startswith("- ")]
    env = ["-               - name: SGLANG_ENABLE_SPEC_V2", '-                 value: "1"']
    assert set(removed) <= {"- " + ln for ln in spec.splitlines()} | set(env) and set(env) <= set(removed), removed
    assert "NEXTN" not in after and after.count("- DDTREE\n") == 2
    assert after.count('"2" # Size of Tensor Parallelism') == 2
    leader = out["containers"][0]
    assert leader["env_unset"] == ["SGLANG_ENABLE_SPEC_V2"] and leader["env_set"] == {"SGLANG_DDTREE_LOG": "0"}
    assert ["--speculative-algorithm", "NEXTN"] in leader["launch"]["dropped"]
    validate(list(yaml.safe_load_all(after)))


@pytest.mark.parametrize("edit,args,message", [
    (None, ["--algo", "ddtree", "--sglang", "0.5.23", "--var", "draft_model_path=/m"],
     "--release-image REF is required"),
    (None, [*ARGS[:-1], "registry.example/fleetspec-release:latest"], "name a version"),
    (None, [*ARGS[:2], "--sglang", "0.4.0", *ARGS[4:]], "no packaged parser table"),
    (("            command:\n              - python3\n              - -m\n              - sglang.launch_server\n",
      "            command:\n              - sh\n              - -c\n              - python3 -m sglang.launch_server\n"),
     ARGS, "the command is a shell wrapper (sh -c"),
    (("                value: $HF_TOKEN\n", "                value: $HF_TOKEN\n              - name: PYTHONPATH\n"
                                              "                value: /x\n"), ARGS, "env sets PYTHONPATH itself"),
])
def test_refusals_are_one_line_and_exit_2(tmp_path, edit, args, message):
    text = (CORPUS / "lws-sglang.yaml").read_text()
    if edit:
        assert edit[0] in text
        text = text.replace(edit[0], edit[1], 1)
    path = tmp_path / "lws.yaml"
    path.write_text(text)
    r = render(path, *args)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_a_published_manifest_without_a_leaderworkerset_is_refused():
    r = render(CORPUS / "lws-disaggregatedset-sglang.yaml", *ARGS)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().endswith("no LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) with a leaderTemplate or "
                                     "workerTemplate in it")


def test_the_crd_schema_catches_a_broken_template():
    """The validation is not vacuous: a container whose args hold a number fails the CRD schema."""
    doc = next(d for d in yaml.safe_load_all((CORPUS / "lws-sglang.yaml").read_text()) if d["kind"] == "LeaderWorkerSet")
    doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"] = ["--tp", 2]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, crd_schema())


def test_docs_job_manifest_is_valid_and_runs_fleetspec_gate():
    """docs/kubernetes.md's Job validates as a core batch/v1 Job, and it and the AnalysisTemplate
    call `gate` with options the command has."""
    import re

    text = (REPO / "docs" / "kubernetes.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    job = next(b for b in blocks if b["kind"] == "Job")
    kubernetes_validate.validate(job, K8S, strict=True)
    template = next(b for b in blocks if b["kind"] == "AnalysisTemplate")
    spec = template["spec"]["metrics"][0]["provider"]["job"]["spec"]
    kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t"}, "spec": spec},
                                 K8S, strict=True)
    help_text = subprocess.run([sys.executable, "-m", "fleetspec", "gate", "--help"], capture_output=True, text=True,
                               cwd=REPO, timeout=60).stdout
    for args in (job["spec"]["template"]["spec"]["containers"][0]["args"], spec["template"]["spec"]["containers"][0]["args"]):
        assert args[0] == "gate"
        for word in args[1:]:
            if word.startswith("--"):
                assert word in help_text, word


LEADER_CMD = ("            command:\n              - python3\n              - -m\n              - sglang.launch_server\n"
              "              - --model-path\n")
LEADER_ENV = "            env:\n              - name: HF_TOKEN\n                value: $HF_TOKEN\n"
LEADER_FLOW = ('            command: ["python3", "-m", "sglang.launch_server",\n                      "--model-path",\n'
               '                      "meta-llama/Meta-Llama-3.1-8B-Instruct", "--tp", "2", "--dist-init-addr", '
               '"$(LWS_LEADER_ADDRESS):20000", "--nnodes", "$(LWS_GROUP_SIZE)", "--node-rank", "$(LWS_WORKER_INDEX)", '
               '"--trust-remote-code", "--host", "0.0.0.0", "--port", "40000"]\n')


def leader_command(text: str) -> str:
    """The leader's whole block-list command, as the published example writes it."""
    start = text.index(LEADER_CMD)
    return text[start:text.index('              - "40000"\n', start) + len('              - "40000"\n')]


@pytest.mark.parametrize("layout", ["args", "flow", "no-env"])
def test_other_layouts_of_the_same_container_are_patched_exactly(tmp_path, layout):
    """The flags in `args` (the program in `command`), a flow-style command over several lines, a
    container without `env`: each patched, validated, the rest kept."""
    text = (CORPUS / "lws-sglang.yaml").read_text()
    if layout == "args":
        text = text.replace(LEADER_CMD, "            command:\n              - python3\n              - -m\n"
                                        "              - sglang.launch_server\n            args:\n"
                                        "              - --model-path\n", 1)
    elif layout == "flow":
        text = text.replace(leader_command(text), LEADER_FLOW, 1)
    else:
        text = text.replace(LEADER_ENV, "", 1)
    path = tmp_path / "lws.yaml"
    path.write_text(text)
    r = render(path, *ARGS)
    assert r.returncode == 0, r.stderr
    ops = difflib.SequenceMatcher(a=text.splitlines(), b=r.stdout.splitlines(), autojunk=False).get_opcodes()
    changed = [text.splitlines()[i1:i2] for op, i1, i2, _, _ in ops if op != "equal" and i1 < i2]
    assert changed == ([LEADER_FLOW.splitlines()] if layout == "flow" else []), changed   # a flow list: whole
    docs = list(yaml.safe_load_all(r.stdout))
    validate(docs)
    leader = docs[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    argv = leader["command"] + leader.get("args", [])
    assert argv[:5] == ["python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Meta-Llama-3.1-8B-Instruct"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
    assert {e["name"] for e in leader["env"]} >= {"SGLANG_DDTREE_LOG", "PYTHONPATH"}


def test_a_playbook_with_nothing_to_ship_changes_only_the_arguments():
    """dflash has no patch set and no kernels: no --release-image, no volume, no PYTHONPATH."""
    before = (CORPUS / "lws-sglang.yaml").read_text()
    r = render(CORPUS / "lws-sglang.yaml", "--algo", "dflash", "--sglang", "0.5.23", "--var", "draft_model_path=/d")
    assert r.returncode == 0, r.stderr
    added = [ln for ln in difflib.ndiff(before.splitlines(), r.stdout.splitlines()) if ln[:2] in ("+ ", "- ")]
    assert added == ["+               - --speculative-algorithm", "+               - DFLASH",
                     "+               - --speculative-draft-model-path", "+               - /d"] * 2
    validate(list(yaml.safe_load_all(r.stdout)))

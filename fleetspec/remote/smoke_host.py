"""Offline smoke tests that deploy runs on the host, in the host's python, with the release on its path.

Each builder returns Python source (run as `python -c SRC`, no files needed on the host) that prints
one JSON object as its last line and exits 0 only when the check passed; `parse_result` reads it.
The scripts import only what the host has: sglang (from the overlay), torch, the stdlib.
RUNNER runs them all in one python process (foreground: run_smoke_scripts; background: ops/smoke_run.py).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from fleetspec.errors import FleetspecError
from fleetspec.model import hostjson
from fleetspec.remote import files
from fleetspec.remote.api import TransportLike

_EMIT = '''
def _emit(ok, **data):
    import json, sys
    data["ok"] = bool(ok)
    sys.stdout.write("\\n" + json.dumps(data, default=str) + "\\n")
    sys.stdout.flush()
    raise SystemExit(0 if ok else 1)
'''


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    data: dict = field(default_factory=dict)

    @property
    def error(self) -> str:
        return str(self.data.get("error", ""))


def parse_result(stdout: str) -> SmokeResult:
    """The JSON object on the last line that starts with '{'; a missing one is a failure."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = hostjson.loads(line)
            except ValueError:
                break
            if isinstance(data, dict):
                return SmokeResult(bool(data.get("ok")), data)
            break
    return SmokeResult(False, {"error": "the smoke script printed no JSON result",
                               "stdout_tail": stdout[-2000:]})


def imports_script(modules: list[str]) -> str:
    """Import each module; report its file (proving the overlay is what got imported)."""
    return _EMIT + f'''
import importlib, traceback
found, failed = {{}}, {{}}
for name in {list(modules)!r}:
    try:
        found[name] = getattr(importlib.import_module(name), "__file__", None)
    except BaseException as err:
        failed[name] = traceback.format_exception_only(type(err), err)[-1].strip()
_emit(not failed, modules=found, failed=failed, error="; ".join(f"{{k}}: {{v}}" for k, v in failed.items()))
'''


def parse_args_script(argv: list[str]) -> str:
    """Parse `argv` with the host's real sglang parser, as `python -m sglang.launch_server` would.

    Plugins load first (0.5.23's launcher does the same). Where `ServerArgs.resolve_once` exists
    (0.5.23), `prepare_server_args` parses without touching a device; older versions validate
    devices in ServerArgs construction, so there the argparse parser alone is run.
    """
    return _EMIT + f'''
import argparse, contextlib, io, traceback
argv = {list(argv)!r}
try:
    from sglang.srt.plugins import load_plugins
    load_plugins()
except ImportError:
    pass
import sglang
import sglang.srt.server_args as sa
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        if hasattr(sa.ServerArgs, "resolve_once"):
            args = sa.prepare_server_args(argv)
        else:
            parser = argparse.ArgumentParser(prog="sglang.launch_server")
            sa.ServerArgs.add_cli_args(parser)
            args = parser.parse_args(argv)
except SystemExit as exc:
    lines = [l for l in err.getvalue().splitlines() if l.strip()]
    _emit(False, exit_code=exc.code, error=lines[-1] if lines else f"parser exited {{exc.code}}",
          server_args_file=sa.__file__)
algo_name = getattr(args, "speculative_algorithm", None)
resolved = None
if algo_name:
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        name = algo_name.upper()
        # ServerArgs maps NEXTN to EAGLE during validation (0.5.13.post1's from_string refuses it).
        name = "EAGLE" if name == "NEXTN" and not hasattr(SpeculativeAlgorithm, "NEXTN") else name
        try:
            resolved = getattr(SpeculativeAlgorithm.from_string(name), "name", None)
        except Exception:
            if name != "EAGLE" or algo_name.upper() != "NEXTN":
                raise
            resolved = "EAGLE"
    except Exception as exc:
        _emit(False, error=f"speculative algorithm {{algo_name!r}}: {{exc}}", server_args_file=sa.__file__)
_emit(True, sglang_version=getattr(sglang, "__version__", None), server_args_file=sa.__file__,
      speculative_algorithm=resolved,
      ddtree={{k: getattr(args, "speculative_ddtree_" + k, None) for k in ("budget", "topk_cap", "shadow_linear")}})
'''


def ddtree_sample_script(budget: int = 16, topk_cap: int | None = 4, seed: int = 0,
                         kernel_required: bool = False) -> str:
    """Build a DDTree on fixed sample logits with the shipped ddtree_utils and check its invariants.
    Reports which candidate path ran (the release's compiled kernel or the torch fallback); with
    kernel_required, the fallback is a failure."""
    return _EMIT + _ddtree_greedy(budget, topk_cap, seed) + _ddtree_sampling(budget, seed, kernel_required)


def _ddtree_greedy(budget: int, topk_cap: int | None, seed: int) -> str:
    """The tree on fixed logits, and the greedy walk a drafter-agreeing target must accept."""
    return f'''
import torch
from sglang.srt.speculative import ddtree_utils as du
kernel = du.kernel_status() if hasattr(du, "kernel_status") else {{"loaded": False, "error": "payload without kernel support"}}
g = torch.Generator().manual_seed({int(seed)})
draft = torch.randn(2, 6, 257, generator=g)
tree = du.build_ddtree(draft, {int(budget)}, {topk_cap!r})
mask = du.visibility_mask(tree)
# A target that always agrees with the drafter's argmax accepts the greedy chain as deep as the
# tree holds it.
best = draft.argmax(-1)
target = torch.full((2, tree.num_nodes, 257), -1e9)
chain = []
for b in range(2):
    for i in range(tree.num_nodes):
        d = int(tree.depth[b, i])
        if d < draft.shape[1]:
            target[b, i, int(best[b, d])] = 0.0
    node, depth = 0, 0
    while True:
        kids = [i for i in range(tree.num_nodes) if int(tree.parents[b, i]) == node
                and depth < draft.shape[1] and int(tree.tokens[b, i]) == int(best[b, depth])]
        if not kids:
            break
        node, depth = kids[0], depth + 1
    chain.append(depth)
walk = du.verify_greedy(tree, target)
'''


def _ddtree_sampling(budget: int, seed: int, kernel_required: bool) -> str:
    """Lossless sampling (chi-square at the root), the invariants, and the verdict."""
    return f'''# Sampling must be lossless: over many draws, the first emitted token (the first accepted draft
# token, or the bonus when none is) is distributed as the target's own softmax at the root. A
# biased walk fails this chi-square (8 tokens, 7 degrees of freedom, 4000 draws, fixed seed; the
# threshold 40 is far beyond the 1e-4 tail, ~29.9, so a correct walk never trips it).
V, D, DRAWS = 8, 3, 4000
small_draft = torch.randn(1, D, V, generator=g) * 2
small = du.build_ddtree(small_draft, 12, 3)
big = du.DDTree(*(x.repeat(DRAWS, 1) for x in (small.tokens, small.parents, small.depth, small.scores, small.valid)),
                budget=small.budget)
root_logits = torch.randn(V, generator=g)
logits = torch.randn(1, small.num_nodes, V, generator=g)
logits[0, 0] = root_logits
sampled = du.verify_sampling(big, logits.repeat(DRAWS, 1, 1), small_draft.repeat(DRAWS, 1, 1),
                             torch.Generator().manual_seed({int(seed)} + 1))
first = torch.where(sampled.accept_length > 0, sampled.accepted_tokens[:, 0], sampled.bonus)
counts = torch.bincount(first.clamp(0, V - 1), minlength=V).double()
expected = torch.softmax(root_logits.double(), -1) * DRAWS
chi2 = float(((counts - expected) ** 2 / expected).sum())
checks = {{
    "sizes": tree.sizes.tolist() == [{int(budget) + 1}] * 2,
    "mask_diagonal": bool(mask.diagonal(dim1=1, dim2=2).all()),
    "greedy_chain": walk.accept_length.tolist() == chain and min(chain) >= 1,
    "layout": all(t.shape == tree.tokens.shape for t in du.to_sglang_layout(tree)),
    "sampling_distribution": bool(chi2 < 40.0 and int(first.min()) >= 0),
}}
candidates = getattr(tree, "candidates", "torch:cpu")
if {bool(kernel_required)!r}:
    checks["kernel_required"] = candidates.startswith("kernel:")
failed = [k for k, v in checks.items() if not v]
error = ", ".join(failed)
if "kernel_required" in failed:
    error = f"the kernel is required (kernel_policy: required) but the tree was built by {{candidates}}: {{kernel.get('error')}}"
_emit(not failed, checks=checks, summary=du.tree_summary(tree), torch=torch.__version__,
      candidates=candidates, kernel=kernel, sampling_chi2=round(chi2, 2), error=error)
'''


def kernel_script(library: str, required: bool = True) -> str:
    """Load a built kernel into the host's torch through the payload's own loader and compare each
    op with the payload's torch code (tree_mask with visibility_mask; topk_logprobs with the
    fallback's candidates, ties and -inf included). The log-probs are held to float64's, not to
    the fallback's float32 logsumexp: in the lab's containers that was seen, twice in about ninety
    runs, off by 4e-5 on a row the kernel had right to 1e-7, which failed a sound kernel;
    `logprob_deviation` reports both. A library that does not load fails when the kernel is
    required; when optional it passes with fallback=True and the reason."""
    return _EMIT + f'''
import torch
from sglang.srt.speculative import ddtree_utils as du
status = du.load_kernel({library!r}) if hasattr(du, "load_kernel") else None
if status is None:
    try:
        torch.ops.load_library({library!r})
        status = {{"loaded": True, "devices": ["cpu"]}}
    except Exception as exc:
        status = {{"loaded": False, "error": f"{{type(exc).__name__}}: {{exc}}"}}
if not status.get("loaded"):
    _emit(not {bool(required)!r}, fallback=True, kernel=status, torch=torch.__version__,
          error=f"loading {library}: {{status.get('error')}}")
g = torch.Generator().manual_seed(0)
tree = du.build_ddtree(torch.randn(4, 8, 64, generator=g), 32, 4)
checks = {{"tree_mask": bool(torch.equal(torch.ops.fleetspec_ddtree.tree_mask(tree.parents), du.visibility_mask(tree)))}}
deviation = None
if hasattr(du, "_candidates_torch"):
    logits = (torch.randn(3, 5, 997, generator=g) * 2).round()
    logits[0, 1] = float("-inf")
    logits[1, :, 7:] = float("-inf")
    got_v, got_i = torch.ops.fleetspec_ddtree.topk_logprobs(logits, 16)
    want_v, want_i = du._candidates_torch(logits, 16)
    exact = (logits.double().gather(-1, want_i) - torch.logsumexp(logits.double(), -1, keepdim=True)).float()
    finite = torch.isfinite(exact)
    deviation = {{"kernel": float((got_v - exact)[finite].abs().max()), "torch": float((want_v - exact)[finite].abs().max())}}
    checks["topk_logprobs"] = bool(torch.equal(got_i, want_i) and torch.allclose(got_v, exact, atol=1e-5, equal_nan=True))
    a = du.build_ddtree(logits, 32, None, use_kernel=True)
    b = du.build_ddtree(logits, 32, None, use_kernel=False)
    checks["same_tree"] = all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("tokens", "parents", "depth", "valid"))
bad = [k for k, v in checks.items() if not v]
_emit(not bad, checks=checks, kernel=status, fallback=False, torch=torch.__version__,
      logprob_deviation=deviation,
      error="kernel differs from the payload's torch code: " + ", ".join(bad) if bad else "")
'''


SMOKE_TIMEOUT_S = 600     # the runner's own limit: a controller that dies never leaves it running


# One python process runs every smoke script in turn (each in a fresh namespace), so sglang is
# imported once per deploy instead of once per test; each script's output and exit code are kept
# apart and read by that script's own parser.
RUNNER = """
import contextlib, io, json, sys, traceback
results = {}
for name, src in json.loads(sys.stdin.read()):
    out, code = io.StringIO(), 0
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(src, "<smoke " + name + ">", "exec"), {"__name__": "__fleetspec_smoke__"})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:
            code = 1
            print(json.dumps({"ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                              "traceback": traceback.format_exc(limit=4)}))
    results[name] = [code, out.getvalue()]
    if code != 0:
        break
sys.stdout.write("\\nFLEETSPEC-SMOKE " + json.dumps(results) + "\\n")
"""


def command_line(argv: list[str]) -> str:
    """A program's argv as one shell command (the smoke runner in a container)."""
    return shlex.join(argv)


def runner_input(scripts: list[tuple[str, str]]) -> bytes:
    return json.dumps([[name, script] for name, script in scripts]).encode()


def runner_results(python: str, rc: int | None, stdout: str, stderr: str) -> dict:
    """The runner's {name: [exit code, output]} from its marker line, or why it did not run."""
    marker = [line for line in stdout.splitlines() if line.startswith("FLEETSPEC-SMOKE ")]
    if not marker:
        tail = (stderr.strip().splitlines() or [f"exit {rc}" if rc is not None else
                                                f"killed or timed out after {SMOKE_TIMEOUT_S} s"])[-1]
        raise FleetspecError(f"smoke tests did not run in {python}: {tail}")
    return hostjson.loads_object(marker[-1].split(" ", 1)[1], "the smoke verdict")


def run_smoke_scripts(t: TransportLike, python: str, scripts: list[tuple[str, str]], pythonpath: str | None, rundir: str):
    """One runner process for all scripts, started in the root-only `rundir` with PYTHONSAFEPATH
    (files.python_c): never from /tmp, where anyone's json.py or torch.py would run as root.
    Returns (the command's result, {name: [exit code, output]})."""
    env = {"PYTHONPATH": pythonpath} if pythonpath else {}
    r = files.run_python(t, python, RUNNER, env=env, rundir=rundir, timeout_s=SMOKE_TIMEOUT_S,
                         timeout=SMOKE_TIMEOUT_S + 60, stdin=runner_input(scripts))
    return r, runner_results(python, r.rc, r.stdout, r.stderr)

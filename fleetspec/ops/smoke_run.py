"""Run a staged release's offline smoke tests in the host's python, before anything switches."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fleetspec.errors import FleetspecError
from fleetspec.model.release import Release
from fleetspec.ops.hoststate import HostState
from fleetspec.remote import files
from fleetspec.remote.api import TransportLike

if TYPE_CHECKING:
    from fleetspec.ops.preflight import Preflight

# One python process runs every smoke script in turn (each in a fresh namespace), so sglang is
# imported once per deploy instead of once per test; each script's output and exit code are kept
# apart and read by that script's own parser.
_SMOKE_RUNNER = """
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


def run_smoke_scripts(t: TransportLike, python: str, scripts: list[tuple[str, str]], pythonpath: str | None, rundir: str):
    """One runner process for all scripts, started in the root-only `rundir` with PYTHONSAFEPATH
    (files.python_c): never from /tmp, where anyone's json.py or torch.py would run as root.
    Returns (the command's result, {name: [exit code, output]})."""
    payload = json.dumps([[name, script] for name, script in scripts]).encode()
    env = {"PYTHONPATH": pythonpath} if pythonpath else {}
    r = files.run_python(t, python, _SMOKE_RUNNER, env=env, rundir=rundir, timeout_s=600, timeout=660,
                         stdin=payload)
    marker = [line for line in r.stdout.splitlines() if line.startswith("FLEETSPEC-SMOKE ")]
    if not marker:
        tail = (r.stderr.strip().splitlines() or [f"exit {r.rc}"])[-1]
        raise FleetspecError(f"smoke tests did not run in {python}: {tail}")
    return r, json.loads(marker[-1].split(" ", 1)[1])


def smoke(t: TransportLike, pf: Preflight, state: HostState, release: Release) -> dict:
    """Run the offline smoke tests in the host's python with the release on its path."""
    overlay = str(state.layout.release(release.id) / "overlay")
    kernels = str(state.layout.release(release.id) / "kernels")
    scripts = pf.smoke_scripts(kernels_dir=kernels)
    if not scripts:
        return {"smoke": {}}
    r, ran = run_smoke_scripts(t, pf.python, [(name, script) for name, script, _ in scripts],
                               overlay if release.files else None, str(state.layout.run))
    results = {}
    for name, _, parse in scripts:
        if name not in ran:
            continue
        code, out = ran[name]
        verdict = parse(out, r.stderr, code)
        results[name] = verdict
        if not verdict.get("ok"):
            raise FleetspecError(f"smoke test {name} failed: {verdict.get('error') or r.stderr.strip()[-300:]}")
    out = {"smoke": {k: {kk: vv for kk, vv in v.items() if kk != 'ok'} for k, v in results.items()}}
    out.update(kernel_path(results))
    return out


def kernel_path(results: dict) -> dict:
    """Which DDTree candidate path the release runs (compiled kernel or torch fallback) as the smoke
    tests saw it, and a note when an optional kernel fell back. Goes into the ledger."""
    out = {}
    sample = results.get("ddtree_sample") or {}
    if sample.get("candidates"):
        out["candidates"] = sample["candidates"]
    fell_back = {name: r.get("error") for name, r in results.items() if name.startswith("kernel:") and r.get("fallback")}
    if fell_back:
        out["kernel_note"] = "; ".join(f"{name} did not load, DDTree uses its torch fallback (kernel_policy: optional): "
                                       f"{why}" for name, why in fell_back.items())
    return out

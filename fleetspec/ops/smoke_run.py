"""Run a staged release's offline smoke tests in the host's python, before anything switches:
in the foreground (`smoke`) or started in the background by the stage command (`prepare`) and
read just before the switch (`finish`)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from fleetspec.errors import FleetspecError, UserError
from fleetspec.model import hostjson
from fleetspec.model.release import Release
from fleetspec.ops.hoststate import HostState
from fleetspec.remote import background, files, stage_host
from fleetspec.remote.api import TransportLike

if TYPE_CHECKING:
    from fleetspec.ops.preflight import Preflight

SMOKE_TIMEOUT_S = 600     # the runner's own limit: a controller that dies never leaves it running

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


def _payload(scripts: list[tuple[str, str]]) -> bytes:
    return json.dumps([[name, script] for name, script in scripts]).encode()


def _ran(python: str, rc: int | None, stdout: str, stderr: str) -> dict:
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
    r = files.run_python(t, python, _SMOKE_RUNNER, env=env, rundir=rundir, timeout_s=SMOKE_TIMEOUT_S,
                         timeout=SMOKE_TIMEOUT_S + 60, stdin=_payload(scripts))
    return r, _ran(python, r.rc, r.stdout, r.stderr)


def smoke_nice() -> int:
    """The background runner's CPU niceness: $FLEETSPEC_SMOKE_NICE (0-19), 10 by default, so the
    engine the gates measure meanwhile keeps the CPU (0 is for measuring that it matters)."""
    raw = os.environ.get("FLEETSPEC_SMOKE_NICE", "10")
    if not raw.isdigit() or int(raw) > 19:
        raise UserError(f"$FLEETSPEC_SMOKE_NICE={raw!r}: expected a whole number from 0 to 19")
    return int(raw)


@dataclass
class SmokeRun:
    """A smoke runner started in the background on the host (`prepare`), read by `finish`."""
    folder: str
    python: str
    scripts: list = field(default_factory=list)   # (name, script, parser)


def run_folder(state: HostState, release_id: str) -> str:
    """The release's root-only folder for its background smoke runner (in, out, err, rc, pid)."""
    return str(state.layout.release(release_id) / "smoke")


def prepare(pf: Preflight, state: HostState, release_id: str) -> tuple[SmokeRun, stage_host.Then | None]:
    """The smoke runner for a release and how to start it detached (None: no scripts), with the
    release's overlay on the path when the patch set has files. The stage command starts it once the
    release is published (staging.stage's `then`), so the deploy renders and measures while it
    runs and reads the verdict (`finish`) before the switch. With `smoke.reuse` (the default) a
    passing verdict is kept on the host under `verdict_key`, and the stage command replays it
    instead when nothing the runner imports from has changed since it ran (stage_host.replay)."""
    rel = state.layout.release(release_id)
    run = SmokeRun(run_folder(state, release_id), pf.python, pf.smoke_scripts(kernels_dir=str(rel / "kernels")))
    if not run.scripts:
        return run, None
    env = {"PYTHONPATH": str(rel / "overlay")} if pf.patchset and pf.patchset.files else {}
    command = files.python_c(pf.python, _SMOKE_RUNNER, env=env, rundir=str(state.layout.run))
    payload = _payload([(n, s) for n, s, _ in run.scripts]).decode()
    reuse = pf.playbook.smoke.reuse
    script = background.start_script(run.folder, command, timeout_s=SMOKE_TIMEOUT_S, nice=smoke_nice(),
                                     on_success=stage_host.keep_verdict(run.folder) if reuse else "")
    cache = None
    if reuse:
        site = pf.sglang.site_packages or ""
        key = verdict_key(str(rel), pf.python, command, payload, pf.patch_files(), pf.kernel_files(),
                          site, pf.sglang.version or "")
        cache = {"dir": str(state.layout.smoke_verdicts), "key": key, "roots": [site] if site else []}
    return run, stage_host.Then(run.folder, script, payload, cache)


def verdict_key(release_dir: str, python: str, command: str, payload: str, patch: dict[str, bytes],
                kernels: dict[str, bytes], site_packages: str, version: str) -> str:
    """What a smoke verdict depends on that the controller knows: the runner's command and input
    with the release's folder taken out (each release has its own; its content is the patch and
    kernel bytes), those bytes, the sglang install, and this fleetspec's smoke code, whose parsers
    read the kept output. The host adds its python, sys.path, environment and GPU driver."""
    from fleetspec.ops import smoke

    def own(text: str) -> str:
        return text.replace(release_dir, "<release>")
    data = {"python": python, "command": own(command), "input": own(payload), "site_packages": site_packages,
            "sglang": version,
            "patch": {p: hashlib.sha256(b).hexdigest() for p, b in sorted(patch.items())},
            "kernels": {n: hashlib.sha256(b).hexdigest() for n, b in sorted(kernels.items())},
            "code": [hashlib.sha256(Path(str(m.__file__)).read_bytes()).hexdigest() for m in (smoke, sys.modules[__name__])]}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def finish(t: TransportLike, run: SmokeRun) -> dict:
    """Wait for the runner the stage command started and read each script's verdict with its own parser."""
    if not run.scripts:
        return {"smoke": {}}
    v = background.wait(t, run.folder, timeout=SMOKE_TIMEOUT_S + 60)
    return _verdicts(run.scripts, _ran(run.python, v.rc, v.stdout, v.stderr), v.stderr)


def tell(detail: dict, host: str, echo: Callable[[str], None]) -> None:
    """What an operator reads of a passing verdict: DDTree's candidate path and any kernel note."""
    if detail.get("candidates"):
        echo(f"[{host}] DDTree candidates: {detail['candidates']}")
    if detail.get("kernel_note"):
        echo(f"[{host}] note: {detail['kernel_note']}")


def stop(t: TransportLike, state: HostState, release_id: str) -> bool:
    """Kill a release's smoke runner if it still runs (a deploy that failed or died before reading it)."""
    return background.stop(t, run_folder(state, release_id))


def smoke(t: TransportLike, pf: Preflight, state: HostState, release: Release) -> dict:
    """Run the offline smoke tests in the host's python with the release on its path, in the
    foreground (one command): `prepare`'s start then `finish` is the same, split around other work."""
    overlay = str(state.layout.release(release.id) / "overlay")
    kernels = str(state.layout.release(release.id) / "kernels")
    scripts = pf.smoke_scripts(kernels_dir=kernels)
    if not scripts:
        return {"smoke": {}}
    r, ran = run_smoke_scripts(t, pf.python, [(name, script) for name, script, _ in scripts],
                               overlay if release.files else None, str(state.layout.run))
    return _verdicts(scripts, ran, r.stderr)


def _verdicts(scripts: list, ran: dict, stderr: str) -> dict:
    results = {}
    for name, _, parse in scripts:
        if name not in ran:
            continue
        code, out = ran[name]
        verdict = parse(out, stderr, code)
        results[name] = verdict
        if not verdict.get("ok"):
            raise FleetspecError(f"smoke test {name} failed: {verdict.get('error') or stderr.strip()[-300:]}")
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

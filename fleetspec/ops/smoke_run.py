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
from fleetspec.model import container_launch
from fleetspec.model.release import Release
from fleetspec.ops.hoststate import HostState
from fleetspec.remote import background, files, smoke_host, stage_host
from fleetspec.remote.api import TransportLike

if TYPE_CHECKING:
    from fleetspec.ops.preflight_result import Preflight


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
    if pf.container is not None:
        command = container_command(pf, str(rel), env)
    else:
        command = files.python_c(pf.python, smoke_host.RUNNER, env=env, rundir=str(state.layout.run))
    payload = smoke_host.runner_input([(n, s) for n, s, _ in run.scripts]).decode()
    # a kept verdict is keyed on the host python's files; a container's are the image's
    reuse = pf.playbook.smoke.reuse and pf.container is None
    script = background.start_script(run.folder, command, timeout_s=smoke_host.SMOKE_TIMEOUT_S, nice=smoke_nice(),
                                     on_success=stage_host.keep_verdict(run.folder) if reuse else "")
    cache = None
    if reuse:
        site = pf.site_packages
        key = verdict_key(str(rel), pf.python, command, payload, pf.patch_files(), pf.kernel_files(),
                          site, pf.sglang_version)
        cache = {"dir": str(state.layout.smoke_verdicts), "key": key, "roots": [site] if site else []}
    return run, stage_host.Then(run.folder, script, payload, cache)


def container_command(pf: Preflight, release_dir: str, env: dict[str, str]) -> str:
    """The runner in a container of the unit's own image and options (container_launch.smoke_argv):
    never a pull, stdin open for the scripts, only the release's folder mounted, read-only
    (its overlay and kernels: container_launch.release_mount), the cwd kept off sys.path (PYTHONSAFEPATH)."""
    assert pf.container is not None
    words = ["--pull=never", "-i", *container_launch.release_mount(release_dir), "-e", "PYTHONSAFEPATH=1"]
    for name, value in env.items():
        words += ["-e", f"{name}={value}"]
    return smoke_host.command_line(container_launch.smoke_argv(pf.container, words, ["-c", smoke_host.RUNNER]))


def verdict_key(release_dir: str, python: str, command: str, payload: str, patch: dict[str, bytes],
                kernels: dict[str, bytes], site_packages: str, version: str) -> str:
    """What a smoke verdict depends on that the controller knows: the runner's command and input
    with the release's folder taken out (each release has its own; its content is the patch and
    kernel bytes), those bytes, the sglang install, and this fleetspec's smoke code, whose parsers
    read the kept output. The host adds its python, sys.path, environment and GPU driver."""

    def own(text: str) -> str:
        return text.replace(release_dir, "<release>")
    data = {"python": python, "command": own(command), "input": own(payload), "site_packages": site_packages,
            "sglang": version,
            "patch": {p: hashlib.sha256(b).hexdigest() for p, b in sorted(patch.items())},
            "kernels": {n: hashlib.sha256(b).hexdigest() for n, b in sorted(kernels.items())},
            "code": [hashlib.sha256(Path(str(m.__file__)).read_bytes()).hexdigest() for m in (smoke_host, sys.modules[__name__])]}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def finish(t: TransportLike, run: SmokeRun) -> dict:
    """Wait for the runner the stage command started and read each script's verdict with its own parser."""
    if not run.scripts:
        return {"smoke": {}}
    v = background.wait(t, run.folder, timeout=smoke_host.SMOKE_TIMEOUT_S + 60)
    return _verdicts(run.scripts, smoke_host.runner_results(run.python, v.rc, v.stdout, v.stderr), v.stderr)


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
    r, ran = smoke_host.run_smoke_scripts(t, pf.python, [(name, script) for name, script, _ in scripts],
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

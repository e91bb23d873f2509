"""The host-changing parts of deploy and rollback: stage a release, render it, switch to it,
restart, and switch back. Each function is one step's work; ops/deploy.py says when each runs.

Release mode: the live venv is never edited. A release folder holds the overlay (a symlink farm
of the installed sglang with the patch set's files laid over it), the kernels, the rendered
drop-in and rollback.sh. Switching is one drop-in rename plus one symlink flip, both atomic.

In-place mode (what operators do by hand): switching also backs up every file it replaces into
releases/<id>/backup/ and checks the copy's hash, then replaces the live files one by one
(temp-then-rename, hash-checked); reverting puts the backups back the same way and removes the
files the patch set added. Either way the ledger says `switched` before the first write.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from pathlib import Path, PurePosixPath

from fleetspec import render
from fleetspec.errors import FleetspecError
from fleetspec.model import ledger as L
from fleetspec.model.names import is_name
from fleetspec.model.release import BASELINE, Release
from fleetspec.ops import probes
from fleetspec.ops.hoststate import DROPIN_NAME, LEGACY_DROPIN_NAMES, HostState, dropin_path, legacy_dropin_paths
from fleetspec.remote import files

q = shlex.quote
LAST_SENT: dict[str, int] = {}   # bytes uploaded per host by the latest stage (for bench/)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Stage ------------------------------------------------------------------------------------
def upload_objects(t, state: HostState, blobs: dict[str, bytes]) -> int:
    """Send each blob the host lacks into the content-addressed store; return bytes sent."""
    store = str(state.layout.objects)
    if not blobs:
        return 0
    missing = t.run_script(files.missing_objects(store, sorted(blobs)), timeout=60, check=True).stdout.split()
    sent = 0
    for digest in missing:
        t.put_bytes(blobs[digest], f"{store}/{digest}", mode=0o644, durable=False)   # hash-checked where used
        sent += len(blobs[digest])
    return sent


def stage(t, pf, state: HostState, release_id: str, previous: str | None, *, mode: str, echo) -> Release:
    """Build releases/<id>/ from scratch in a temp folder, verify it, then rename it into place."""
    layout = state.layout
    final = str(layout.release(release_id))
    tmp = final + files.TMP_SUFFIX
    patch_files = pf.patch_files()          # package path -> bytes
    kernel_files = pf.kernel_files()        # file name -> bytes
    blobs = {_sha(b): b for b in [*patch_files.values(), *kernel_files.values()]}
    LAST_SENT[pf.host.name] = upload_objects(t, state, blobs)
    store = str(layout.objects)
    lines = [f"rm -rf {q(tmp)}", f"mkdir -p {q(tmp)}/patch {q(tmp)}/kernels {q(tmp)}/unit"]
    for path, data in sorted(patch_files.items()):
        dest = f"{tmp}/patch/{path}"
        lines.append(f"mkdir -p {q(str(PurePosixPath(dest).parent))} && cp {q(store + '/' + _sha(data))} {q(dest)}")
    for name, data in sorted(kernel_files.items()):
        lines.append(f"cp {q(store + '/' + _sha(data))} {q(tmp + '/kernels/' + name)}")
    script = " && ".join(lines)
    if patch_files:   # in-place mode too: the smoke tests run against the overlay before the switch;
        # one command: the copies, then the overlay (`set -eu`), which checks each file's sha256
        script = f"{{ {script}; }} || exit 1\n" + pf.overlay_script(f"{tmp}/patch", f"{tmp}/overlay")
    t.run_script(script, timeout=300, check=True)
    if patch_files:
        _py_compile(t, pf, [f"{tmp}/overlay/{p}" for p in patch_files if p.endswith(".py")])
    release = Release(
        id=release_id, host=pf.host.name, service=pf.service, algo=pf.playbook.algo, mode=mode,
        sglang_version=pf.sglang.version, argv=pf.new_argv, previous=previous or BASELINE,
        patchset=pf.patchset_name, files={p: _sha(b) for p, b in patch_files.items()},
        kernels={n: _sha(b) for n, b in kernel_files.items()}, options=dict(pf.options.values),
        notes=list(pf.notes), site_packages=pf.sglang.site_packages,
        base_files={f.path: f.base_sha256 for f in pf.patchset.files} if pf.patchset else {},
        exec_prefix=pf.exec_prefix, exec_path=pf.exec_path,
        launch=pf.launch.to_dict() if pf.launch else {},
    )
    secrets = pf.secret_values()
    if secrets:
        t.run_script(f"mkdir -m 0700 {q(tmp + '/secrets')}", timeout=30, check=True)
        t.put_bytes(env_file_text(secrets).encode(), f"{tmp}/{SECRETS_FILE}", mode=0o600, durable=False)
    t.put_bytes(release.to_json().encode(), f"{tmp}/manifest.json", mode=0o644, durable=False)
    # One syncfs for the whole tree (thousands of overlay links) before it gets its final name,
    # then the rename itself: `current` may point here after a power cut only at a whole release.
    t.run_script(f"sync -f -- {q(tmp)} && rm -rf -- {q(final)} && mv -T -- {q(tmp)} {q(final)} && "
                 f"{files.fsync(files.parent(final))}", timeout=120, check=True)
    return release


def _py_compile(t, pf, paths: list[str]) -> None:
    if not paths:
        return
    code = "import py_compile,sys\nfor p in sys.argv[1:]: py_compile.compile(p, doraise=True, cfile=None)"
    r = t.run_script(files.python_c(pf.python, code, paths, rundir=str(pf.layout.run)), timeout=300, check=False)
    if r.rc != 0:
        raise FleetspecError(f"py_compile failed on the host: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")


# Smoke tests --------------------------------------------------------------------------------
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


def run_smoke_scripts(t, python: str, scripts: list[tuple[str, str]], pythonpath: str | None, rundir: str):
    """One runner process for all scripts, started in the root-only `rundir` with PYTHONSAFEPATH
    (files.python_c): never from /tmp, where anyone's json.py or torch.py would run as root.
    Returns (the command's result, {name: [exit code, output]})."""
    payload = json.dumps([[name, script] for name, script in scripts]).encode()
    env = {"PYTHONPATH": pythonpath} if pythonpath else {}
    r = t.run_script(files.python_c(python, _SMOKE_RUNNER, env=env, rundir=rundir, timeout_s=600), timeout=660,
                     check=False, stdin=payload)
    marker = [line for line in r.stdout.splitlines() if line.startswith("FLEETSPEC-SMOKE ")]
    if not marker:
        tail = (r.stderr.strip().splitlines() or [f"exit {r.rc}"])[-1]
        raise FleetspecError(f"smoke tests did not run in {python}: {tail}")
    return r, json.loads(marker[-1].split(" ", 1)[1])


def smoke(t, pf, state: HostState, release: Release) -> dict:
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


# Render ---------------------------------------------------------------------------------------
def _env(root: Path):
    env = render.environment(root)
    env.filters["q"] = shlex.quote
    return env


SECRETS_FILE = "secrets/env"      # in the release folder: the folder 0700, the file 0600


def env_file_text(values: dict[str, str]) -> str:
    """An EnvironmentFile= body: NAME="value", with \\ " ` $ escaped as systemd's parser wants."""
    def esc(v: str) -> str:
        return "".join("\\" + c if c in '\\"`$' else c for c in v)
    return "".join(f'{k}="{esc(v)}"\n' for k, v in values.items())


def dropin_text(pf, release: Release) -> str:
    env_lines = [render.environment_line(k, v) for k, v in pf.environment(release).items()]
    for name in (release.launch or {}).get("env_dropped", []):   # speculation-only, dropped by the playbook
        env_lines.append(f"UnsetEnvironment={name}")
    if pf.playbook.launch.secret_env:   # values never in the drop-in (0644): a file only root reads
        env_lines.append(f"EnvironmentFile={pf.layout.release(release.id)}/{SECRETS_FILE}")
    return _env(pf.root).get_template("fleetspec-dropin.conf.j2").render(
        release=release, rendered_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        release_dir=str(pf.layout.release(release.id)), exec_line=render.exec_line(release.argv, release.exec_prefix, release.exec_path),
        environment_lines=env_lines, guard=pf.guard, service_escaped=pf.service.removesuffix(".service"),
    )


def rollback_script(pf, state: HostState, release: Release, previous_dropin: bytes | None) -> str:
    prev = release.previous
    prev_dir = str(state.layout.release(prev)) if prev != BASELINE else ""
    return _env(pf.root).get_template("rollback.sh.j2").render(
        service=pf.service, release=release, previous_label=prev,
        state_dir=str(state.layout.base), dropin_path=dropin_path(pf.service),
        legacy_dropin_paths=legacy_dropin_paths(pf.service),
        previous_dropin=release_dropin_candidates(prev_dir) if prev_dir else [],
        previous_dropin_sha256=_sha(previous_dropin) if (prev_dir and previous_dropin) else "",
        previous_current=prev_dir,
        restore_files=[{"backup": f"{state.layout.release(release.id)}/backup/{p}", "path": f"{release.site_packages}/{p}",
                        "sha256": base} for p, base in sorted(release.base_files.items())
                       if base and release.mode == "in-place"],
        remove_files=[f"{release.site_packages}/{p}" for p, base in sorted(release.base_files.items())
                      if not base and release.mode == "in-place"],
        unit_sha256=pf.baseline.unit_sha256, unit_path=pf.baseline.unit_path,
    )


def render_release(t, pf, state: HostState, release: Release) -> dict:
    text = dropin_text(pf, release)
    rdir = str(state.layout.release(release.id))
    prev_dropin = state.dropin_bytes() if release.previous != BASELINE else None
    # both written, then made durable in one command (nothing uses them before `switch`)
    t.put_bytes(text.encode(), f"{rdir}/unit/{DROPIN_NAME}", mode=0o644, durable=False)
    t.put_bytes(rollback_script(pf, state, release, prev_dropin).encode(), f"{rdir}/rollback.sh", mode=0o755,
                durable=False)
    t.run_script(files.fsync(f"{rdir}/unit/{DROPIN_NAME}", f"{rdir}/rollback.sh", f"{rdir}/unit", rdir),
                 timeout=60, check=True)
    if pf.guard:
        guard = _env(pf.root).get_template("fleetspec-guard@.service.j2").render(state_root=str(state.layout.root))
        t.put_bytes(guard.encode(), "/etc/systemd/system/fleetspec-guard@.service", mode=0o644)
    lint = lint_unit(t, pf, text)
    return {"dropin_sha256": _sha(text.encode()), "lint": lint}


def lint_unit(t, pf, dropin: str) -> str:
    """systemd-analyze verify on a scratch copy of the unit with the new drop-in, where present."""
    from fleetspec.remote import systemd

    r = t.run_script(systemd.verify_script(str(pf.layout.run), pf.service, pf.unit_bytes, DROPIN_NAME, dropin.encode()),
                     timeout=60, check=False)
    if r.stdout.strip() == systemd.NO_ANALYZE:
        return "skipped (no systemd-analyze)"
    lines = (r.stderr + r.stdout).splitlines()
    bad = [line for line in lines if DROPIN_NAME in line or "ExecStart" in line or "Invalid" in line]
    ours = [line for line in lines if DROPIN_NAME in line]   # a setting systemd would ignore
    if (r.rc != 0 and bad) or ours:
        raise FleetspecError("systemd-analyze verify refused the rendered unit: " + " | ".join((ours or bad)[:3]))
    return "ok" if r.rc == 0 else "warnings: " + " | ".join((r.stderr + r.stdout).strip().splitlines()[:2])


# Switch, restart, revert ------------------------------------------------------------------------
def activate(t, state: HostState, release: Release, after_files=None) -> None:
    """Point the service at `release`: files (in-place mode), drop-in renamed into place,
    `current` flipped, reload. `after_files` runs between the two (a test hook's pause point)."""
    rdir = str(state.layout.release(release.id))
    d = state.dropin
    if release.mode == "in-place":
        t.run_script(in_place_apply(release, rdir), timeout=300, check=True)
        if after_files is not None:
            after_files()
    # A release folder made before the rename holds its drop-in under the legacy name.
    src = " ".join(q(p) for p in release_dropin_candidates(rdir))
    t.run_script(" && ".join([
        f"mkdir -p {q(str(PurePosixPath(d).parent))}",
        f"for src in {src}; do [ -e \"$src\" ] && break; done",
        _copy_dropin_from_var(d),
        *[files.remove_durable(p) for p in legacy_dropin_paths(state.service)],
        files.symlink_atomic(rdir, str(state.layout.current)),
        "systemctl daemon-reload",
    ]), timeout=120, check=True)


def loaded_exec_start_mismatch(t, service: str, release: Release) -> str | None:
    """After daemon-reload, before the restart: does systemd now hold the derived ExecStart?
    An admin drop-in applied after fleetspec's (or one created since preflight) would leave the old
    command in place and the restart would serve it. None when it matches; else what differs."""
    from fleetspec.remote.facts import systemd as systemd_fact

    unit = systemd_fact.parse(t.run_script(systemd_fact.command(service), timeout=30, check=True).stdout)
    return exec_start_mismatch(unit.exec_start, release.argv, release.exec_prefix, release.exec_path)


def exec_start_mismatch(shown: list, argv: list[str], prefix: str = "", path: str | None = None) -> str | None:
    """Compare `systemctl show -p ExecStart` (facts.systemd ExecInfo list) with the command fleetspec
    rendered. systemctl joins argv[] with spaces and prints it as stored (`$$` not yet expanded),
    so the comparison is made against the same stored form of the rendered line (pure)."""
    from fleetspec.remote.facts import unitfile

    want = unitfile.parse_exec(render.exec_line(argv, prefix, path))[0]
    if len(shown) != 1:
        return f"systemd holds {len(shown)} ExecStart= commands (expected 1)"
    got = shown[0]
    problems = []
    if " ".join(got.argv) != " ".join(want.argv):
        problems.append(f"argv is {' '.join(got.argv)[:300]!r}")
    if want.path.startswith("/") and got.path != want.path:
        problems.append(f"path is {got.path!r}, expected {want.path!r}")
    if got.ignore_errors != ("-" in prefix):
        problems.append(f"ignore_errors={'yes' if got.ignore_errors else 'no'}")
    return "; ".join(problems) or None


def release_dropin_candidates(rdir: str) -> list[str]:
    """Where a release folder keeps its rendered drop-in: today's name first, then legacy ones."""
    return [f"{rdir}/unit/{n}" for n in (DROPIN_NAME, *LEGACY_DROPIN_NAMES)]


def _copy_dropin_from_var(dest: str) -> str:
    """Copy "$src" (set by the loop before it) to dest via a temp file and rename, fsyncing the copy
    before the rename and the folder after it."""
    tmp = dest + files.TMP_SUFFIX
    return (f'cp -p -- "$src" {q(tmp)} && {files.fsync(tmp)} && mv -f -- {q(tmp)} {q(dest)} && '
            f'{files.fsync(files.parent(dest))}')


def leave(t, state: HostState, also=()) -> None:
    """Undo what the current release changed outside its own folder (in-place files), then what
    each release in `also` changed: one a deploy switched to but was cut off from before `current`
    pointed at it (its files may be in place, all or some)."""
    current = state.current()
    for rid in dict.fromkeys(r for r in (current, *also) if r):
        if state.release_exists(rid):
            release = state.read_release(rid)
            if release.mode == "in-place":
                t.run_script(in_place_undo(release, str(state.layout.release(rid))), timeout=300, check=True)


def in_place_apply(release: Release, rdir: str) -> str:
    """Back up every file the patch set replaces (each copy hash-checked against the base), and
    only then replace the live files: a drifted base stops the script before any live write."""
    site = release.site_packages
    lines = ["set -e"]
    for path, base in sorted(release.base_files.items()):
        if base:
            live, backup = f"{site}/{path}", f"{rdir}/backup/{path}"
            lines.append(f"mkdir -p {q(str(PurePosixPath(backup).parent))}")
            lines.append(f"[ -e {q(backup)} ] || {{ {files.copy_atomic(live, backup, base)} || exit 1; }}")
    for path, sha in sorted(release.files.items()):
        live = f"{site}/{path}"
        lines.append(f"mkdir -p {q(str(PurePosixPath(live).parent))}")
        lines.append(files.copy_atomic(f"{rdir}/patch/{path}", live, sha) + " || exit 1")
        lines.append(_drop_pyc(live))
    return "\n".join(lines)


def in_place_undo(release: Release, rdir: str) -> str:
    """Put the backups back (hash-checked against the base) and remove added files. A file that
    already hashes as its base is left alone, so undoing a partly applied release works too."""
    site = release.site_packages
    lines = ["set -e"]
    for path in sorted(release.files):
        live, base = f"{site}/{path}", release.base_files.get(path)
        if base:
            pristine = f"printf '%s\\n' {q(base + '  ' + live)} | sha256sum -c --quiet --status 2>/dev/null"
            lines.append(f"{pristine} || {{ {files.copy_atomic(f'{rdir}/backup/{path}', live, base)} || exit 1; }}")
        else:
            lines.append(files.remove(live))
        lines.append(_drop_pyc(live))
    return "\n".join(lines)


def _drop_pyc(live: str) -> str:
    p = PurePosixPath(live)
    if p.suffix != ".py":
        return "true"
    return f"rm -f {q(str(p.parent / '__pycache__' / p.stem))}.*.pyc"


def deactivate(t, state: HostState, baseline, also=()) -> None:
    """Back to the baseline: no fleetspec drop-in, no `current`, recorded unit and drop-ins byte-exact."""
    leave(t, state, also)
    t.run_script(" && ".join([files.remove_durable(state.dropin),
                              *[files.remove_durable(p) for p in legacy_dropin_paths(state.service)],
                              files.remove_durable(str(state.layout.current))]), timeout=60, check=True)
    restore_baseline_files(t, baseline)
    t.run_script("systemctl daemon-reload", timeout=120, check=True)


def restore_baseline_files(t, baseline) -> None:
    """Rewrite the unit file and admin drop-ins only where their bytes differ from the record, each
    with the mode it had (a 0600 drop-in holding a token stays 0600; unrecorded: 0644 unit, 0600 drop-in)."""
    wanted = {baseline.unit_path: baseline.unit_bytes, **baseline.dropins}
    got = files.parse_sha256sum(t.run_script(files.sha256_of(sorted(wanted)), timeout=60, check=True).stdout)
    for path, data in wanted.items():
        if got.get(path) != _sha(data):
            default = 0o644 if path == baseline.unit_path else 0o600
            t.put_bytes(data, path, mode=baseline.modes.get(path, default) & 0o7777)


def restart(t, service: str):
    """Restart (one command) and return the state from before, for the readiness wait."""
    from fleetspec.remote import systemd

    return systemd.restart(t, service)


def journal_tail(t, service: str, lines: int = 20) -> list[str]:
    r = t.run_script(f"journalctl --unit={q(service)} -n {int(lines)} --no-pager -o cat 2>&1", timeout=30, check=False)
    return r.stdout.strip().splitlines()[-lines:]


def revert_to(t, state: HostState, host, root: Path, baseline, previous: str | None, *,
              progress=lambda _: None, also=()) -> probes.ProbeResult:
    """Switch to `previous` (a healthy release, or None for the baseline), restart, prove it.
    `also`: releases switched to without `current` pointing at them, whose in-place files to undo."""
    if previous is None:
        deactivate(t, state, baseline, also)
        expected = baseline.served_algorithm
    else:
        release = state.read_release(previous)
        leave(t, state, also)
        activate(t, state, release)
        expected = expected_algorithm(root, release.algo)
    before = restart(t, state.service)
    return probes.wait_healthy(t, state.service, probes.spec_for_host(host, expected), since=before,
                               progress=progress)


def expected_algorithm(root: Path, algo: str) -> str:
    from fleetspec.model.playbook import load_playbook_for

    return load_playbook_for(root, algo).speculative_algorithm


# Commit ----------------------------------------------------------------------------------------
def prune(t, state: HostState, keep: int, protect=()) -> list[str]:
    """Remove healthy releases beyond the newest `keep` (never the current one, nor `protect`: the
    release a deploy came from, which `--rollback-all-on-abort` returns to). Failed releases
    do not count towards `keep`: the newest `keep` of them are kept for forensics, older ones go
    too (a host that failed often filled its disk with them)."""
    current = state.current()
    statuses = state.ledger().releases()
    healthy = [r for r, s in statuses.items() if s == L.HEALTHY]
    failed = [r for r, s in statuses.items() if s in (L.FAILED, L.ROLLED_BACK)]
    old = [r for r in healthy[:-keep] + failed[:-keep] if r != current and r not in protect] if keep > 0 else []
    for rid in old:
        if not is_name(rid):    # the ledger parser drops such lines; a path part is checked where it is used too
            continue
        t.run_script(f"rm -rf -- {q(str(state.layout.release(rid)))}", timeout=120, check=True)
        state.record(L.Entry.status(rid, L.PRUNED))
    return old


# Plan --------------------------------------------------------------------------------------------
def plan(t, pf, state: HostState) -> dict:
    """Everything a deploy would do, computed without changing anything on the host."""
    import difflib

    old = pf.exec_argv
    new = pf.new_argv
    diff = list(difflib.unified_diff([a + "\n" for a in old], [a + "\n" for a in new],
                                     f"{pf.service} ExecStart (now)", f"{pf.service} ExecStart (after)", n=2))
    fake = Release(id="<new>", host=pf.host.name, service=pf.service, algo=pf.playbook.algo, mode="release",
                   sglang_version=pf.sglang.version, argv=new, previous=state.current() or BASELINE,
                   exec_prefix=pf.exec_prefix, exec_path=pf.exec_path,
                   launch=pf.launch.to_dict() if pf.launch else {})
    dropin = dropin_text(pf, fake)
    return {
        "host": pf.host.name, "service": pf.service, "sglang": pf.sglang.version,
        "algo": pf.playbook.algo, "expected_algorithm": pf.playbook_algorithm,
        "notes": list(pf.notes), "options": dict(pf.options.values),
        "execstart_diff": pf.redact("".join(diff)), "dropin": pf.redact(dropin),
        "files": {p: _sha(b) for p, b in pf.patch_files().items()},
        "kernels": {n: _sha(b) for n, b in pf.kernel_files().items()},
        "smoke": [name for name, _, _ in pf.smoke_scripts(kernels_dir="<release>/kernels")],
        "gates": pf.gate_names(), "previous": state.current() or BASELINE,
        "launch": json.loads(pf.redact(json.dumps(pf.launch.to_dict()))) if pf.launch else None,
    }

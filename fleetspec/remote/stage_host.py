"""The stage step as one SSH command: one program in the host's python builds a release aside,
publishes it, and starts its smoke runner (issue 17, one round trip per step).

Its stdin carries what must never be in a command line (`/proc/*/cmdline` is world-readable on
the host): a length-prefixed JSON header with the manifest, the secrets file and the smoke
runner's input. The program answers one line naming the objects its store lacks, and the client
writes exactly those blobs, in that order, on the same stdin; when the store has them all the
program goes on without waiting for the client. Then, in the host's python, started as
files.python_c starts it (root-only folder, PYTHONSAFEPATH): copies from the store into
`<final>.fleetspec-tmp`, the overlay script (its own sha256 check), py_compile, secrets/env (0600
in 0700) and manifest.json, one syncfs, the rename over `<final>` and an fsync of its folder;
only then the smoke runner (background.start_script). Any failure removes the temp folder and
exits 1 with one line on stderr: no half release ever has the final name, and no runner starts.
With `reuse`, a folder already at `<final>` whose manifest.json and secrets/env are byte for byte
the header's (a release --prestage staged) is used as it is, and so is the smoke runner the
prestage started in it when its input is this one's and it passed or still runs (`kept`): the
later host's smoke verdict is then ready, or nearly, when its deploy asks for it.
With the runner's `cache` (smoke_run.prepare, `smoke.reuse`), a passing verdict kept for the same
key is replayed into the new release's runner folder instead of starting the runner, when a
`find` over what the runner imports from (`roots`), started before the build and read after it,
sees no inode changed since that verdict's run began; a prestage's passed runner is kept only
under the same check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from shlex import quote as q

from fleetspec.errors import RemoteError
from fleetspec.model import hostjson
from fleetspec.remote import files
from fleetspec.remote.api import CommandResult, TransportLike
from fleetspec.remote.exchange import Exchange, close_quietly

NEED = "FLEETSPEC-STAGE-NEED"
DONE = "FLEETSPEC-STAGE-DONE "
FAILED = "FLEETSPEC-STAGE-FAILED "

PROGRAM = r'''
import hashlib, json, os, shutil, subprocess, sys
inp = sys.stdin.buffer
class Failed(Exception):
    pass
def say(line):
    sys.stdout.write(line + "\n"); sys.stdout.flush()
def last(b):
    lines = b.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""
def take(n, what):
    data = inp.read(n)
    if len(data) != n:
        raise Failed("stdin ended after %d of %d bytes of %s" % (len(data), n, what))
    return data
def write(path, data, mode):
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode), "wb") as f:
        os.fchmod(f.fileno(), mode); f.write(data)
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
def receive(store, digest, size):
    h, tmp, left = hashlib.sha256(), os.path.join(store, digest + ".fleetspec-tmp"), size
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), "wb") as f:
        while left:
            chunk = take(min(left, 1 << 20), "object " + digest)
            h.update(chunk); f.write(chunk); left -= len(chunk)
    if h.hexdigest() != digest:
        os.unlink(tmp)
        raise Failed("object %s arrived with sha256 %s" % (digest, h.hexdigest()))
    os.rename(tmp, os.path.join(store, digest))
def same(h):
    secrets = None if h["secrets"] is None else h["secrets"].encode()
    return (read(os.path.join(h["final"], "manifest.json")) == h["manifest"].encode()
            and read(os.path.join(h["final"], "secrets", "env")) == secrets)
def build(h, tmp):
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("patch", "kernels", "unit"):
        os.makedirs(os.path.join(tmp, sub))
    for rel, digest in sorted(h["patch"].items()):
        dest = os.path.join(tmp, "patch", rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(h["store"], digest), dest)
    for name, digest in sorted(h["kernels"].items()):
        shutil.copyfile(os.path.join(h["store"], digest), os.path.join(tmp, "kernels", name))
    if h["overlay"]:
        r = subprocess.run(["sh", "-c", h["overlay"]], stdin=subprocess.DEVNULL, capture_output=True)
        if r.returncode:
            raise Failed("building the overlay exited %d: %s" % (r.returncode, last(r.stderr + r.stdout)))
    if h["compile"]:
        import py_compile
        for rel in h["compile"]:
            try:
                py_compile.compile(os.path.join(tmp, rel), dfile=os.path.join(h["final"], rel), doraise=True)
            except py_compile.PyCompileError as err:
                raise Failed("py_compile failed on the host: " + " ".join(str(err).split())[-300:])
    if h["secrets"] is not None:
        os.mkdir(os.path.join(tmp, "secrets"), 0o700)
        os.chmod(os.path.join(tmp, "secrets"), 0o700)
        write(os.path.join(tmp, "secrets", "env"), h["secrets"].encode(), 0o600)
    write(os.path.join(tmp, "manifest.json"), h["manifest"].encode(), 0o644)
def publish(tmp, final):
    r = subprocess.run(["sync", "-f", "--", tmp], stdin=subprocess.DEVNULL, capture_output=True)
    if r.returncode:
        raise Failed("sync -f exited %d: %s" % (r.returncode, last(r.stderr)))
    if os.path.lexists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    fd = os.open(os.path.dirname(final), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
def start(then, env=None):
    try:
        r = subprocess.run(["sh", "-c", then["script"]], input=then["stdin"].encode(), capture_output=True,
                           timeout=60, env=env)
    except subprocess.TimeoutExpired:
        return "could not start a background process in %s: no answer in 60 s" % then["folder"]
    if r.returncode:
        return "could not start a background process in %s: %s" % (then["folder"], last(r.stderr) or
                                                                     "exit %d" % r.returncode)
    return None
def kept(then):
    """A runner a prestage started in this reused folder, fed the same input, that passed or still
    runs: its verdict is this deploy's (a failed or dead one is run again)."""
    f = then["folder"]
    if read(os.path.join(f, "in")) != then["stdin"].encode():
        return False
    rc = read(os.path.join(f, "rc"))
    if rc is not None:
        return rc.strip() == b"0"
    pid = (read(os.path.join(f, "pid")) or b"").strip().decode()
    return pid.isdigit() and (f + "/").encode() in (read("/proc/%s/cmdline" % pid) or b"")
def roots(extra):
    """What the runner's imports can come from: the python, the loader's cache, every sys.path
    entry, where sglang and torch resolve (an editable install's source), the site-packages the
    overlay is built from; nested ones dropped."""
    import importlib.util
    paths = [sys.executable, "/etc/ld.so.cache", *extra, *[p for p in sys.path if p]]
    for name in ("sglang", "torch"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        paths += list(spec.submodule_search_locations or []) if spec else []
    out = []
    for p in sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}):
        if not any(p.startswith(o.rstrip("/") + "/") for o in out):
            out.append(p)
    return out
def entry_path(cache):
    """The verdict's file: the controller's key for the runner's input and release content, with
    what only the host knows (its python, sys.path, environment, GPU driver)."""
    skip = {"PWD", "OLDPWD", "SHLVL", "_"}
    env = sorted((k, v) for k, v in os.environ.items()
                 if k not in skip and not k.startswith(("SSH_", "XDG_SESSION_")))     # per session
    driver = (read("/proc/driver/nvidia/version") or b"").decode("utf-8", "replace")
    data = [cache["key"], sys.executable, sys.version, sys.path, env, driver]
    return os.path.join(cache["dir"], hashlib.sha256(json.dumps(data).encode()).hexdigest())
def changes(paths, since):
    """A find for anything under `paths` whose inode changed (written, replaced, added, removed:
    the folder changes) since the second `since` (a runner's start), less a second."""
    cmd = ["find", "-L", *paths, "-newerct", "@%d" % (int(since) - 1), "-print", "-quit"]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
def unchanged(proc, timeout=30):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return False
    return proc.returncode == 0 and not out.strip()
def look(entry, paths):
    head = (read(entry) or b"").split(b"\n", 1)[0].split()
    if len(head) != 2 or not head[0].isdigit():
        return None
    return head, changes(paths, head[0])
def fresh(folder, paths):
    """A prestage's runner that passed is kept only while nothing changed since it started."""
    started = (read(os.path.join(folder, "started")) or b"").strip()
    if read(os.path.join(folder, "rc")) is None:
        return True
    return started.isdigit() and unchanged(changes(paths, started))
def replay(then, entry, looking):
    """The cached verdict as this release's runner output (rc 0), when nothing changed since it ran."""
    head, proc = looking
    same = unchanged(proc)
    text = read(entry)
    if not same or text is None or text.split(b"\n", 1)[0].split() != head:
        try:
            os.unlink(entry)
        except FileNotFoundError:
            pass
        return None
    f = then["folder"]
    shutil.rmtree(f, ignore_errors=True)
    os.mkdir(f, 0o700)
    os.chmod(f, 0o700)
    # the key leaves the release's folder out, so the output names this one's where it named its own
    was, now = os.path.dirname(head[1]) + b"/", os.path.dirname(f.rstrip("/")).encode() + b"/"
    out = text.split(b"\n", 1)[1].replace(was, now)
    for name, data in (("in", then["stdin"].encode()), ("out", out), ("err", b""),
                       ("started", head[0] + b"\n"), ("reused", entry.encode() + b"\n"), ("rc", b"0\n")):
        write(os.path.join(f, name), data, 0o600)
    return {"release": os.path.basename(os.path.dirname(head[1].decode())), "started": int(head[0])}
def prune(folder, keep=32):
    names = [n for n in os.listdir(folder) if not n.endswith(".tmp")]
    names.sort(key=lambda n: os.lstat(os.path.join(folder, n)).st_mtime, reverse=True)
    for n in names[keep:]:
        os.unlink(os.path.join(folder, n))
def main():
    h = json.loads(take(int(inp.readline() or b"0"), "the header"))
    tmp = h["final"] + ".fleetspec-tmp"
    os.makedirs(h["store"], exist_ok=True)
    reused = bool(h["reuse"]) and same(h)
    cache = h["then"].get("cache") if h["then"] else None
    paths = roots(cache["roots"]) if cache else None
    keep = bool(h["then"]) and reused and kept(h["then"]) and (not cache or fresh(h["then"]["folder"], paths))
    looking = entry = None
    if cache and not keep:
        os.makedirs(cache["dir"], 0o700, exist_ok=True)
        entry = entry_path(cache)
        looking = look(entry, paths)
    need = [] if reused else [d for d in sorted(h["objects"]) if not os.path.exists(os.path.join(h["store"], d))]
    say("FLEETSPEC-STAGE-NEED" + "".join(" " + d for d in need))
    try:
        for digest in need:
            receive(h["store"], digest, h["objects"][digest])
        if not reused:
            build(h, tmp)
            publish(tmp, h["final"])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if looking:
            looking[1].kill()
        raise
    again = replay(h["then"], entry, looking) if looking else None
    smoke = None
    if h["then"] and not keep and not again:
        smoke = start(h["then"], dict(os.environ, FLEETSPEC_SMOKE_VERDICT=entry) if entry else None)
        if entry:
            prune(cache["dir"])
    say("FLEETSPEC-STAGE-DONE " + json.dumps({"reused": reused, "smoke_error": smoke, "smoke_kept": keep,
                                                "smoke_reused": again}))
try:
    main()
except (Failed, OSError, ValueError, KeyError) as err:
    sys.stderr.write("FLEETSPEC-STAGE-FAILED " + " ".join(str(err).split())[:400] + "\n")
    sys.exit(1)
'''


def keep_verdict(folder: str) -> str:
    """Shell for a runner's `on_success` (background.start_script): its output, headed by the
    second it started and its folder (what PROGRAM's `look` and `replay` read), becomes the
    verdict file PROGRAM named in $FLEETSPEC_SMOKE_VERDICT."""
    f = folder.rstrip("/")
    return (f'v="${{FLEETSPEC_SMOKE_VERDICT:-}}"; [ -z "$v" ] || {{ {{ printf \'%s %s\\n\' '
            f'"$(cat {q(f + "/started")})" {q(f)}; cat -- {q(f + "/out")}; }} >"$v.tmp" && '
            f'mv -f -- "$v.tmp" "$v"; }} 2>/dev/null || true')


@dataclass
class Then:
    """A detached process to start once the release is published (background.start_script)."""
    folder: str
    script: str
    stdin: str
    cache: dict | None = None     # {"dir", "key", "roots"}: a kept verdict to replay (smoke_run.prepare)


@dataclass
class Plan:
    store: str                    # the content-addressed object store
    final: str                    # releases/<id>
    blobs: dict[str, bytes]       # sha256 -> bytes: every object the release uses
    patch: dict[str, str] = field(default_factory=dict)      # package path -> sha256 (patch/<path>)
    kernels: dict[str, str] = field(default_factory=dict)    # file name -> sha256 (kernels/<name>)
    overlay: str | None = None    # overlay.overlay_script, run after the copies
    compile: list[str] = field(default_factory=list)         # release-relative .py paths to py_compile
    manifest: str = ""
    secrets: str | None = None    # secrets/env's text; None: no secrets folder
    reuse: bool = False
    then: Then | None = None

    def header(self) -> bytes:
        data = {"store": self.store, "final": self.final, "objects": {d: len(b) for d, b in self.blobs.items()},
                "patch": self.patch, "kernels": self.kernels, "overlay": self.overlay, "compile": self.compile,
                "manifest": self.manifest, "secrets": self.secrets, "reuse": self.reuse,
                "then": self.then.__dict__ if self.then else None}
        body = json.dumps(data).encode()
        return b"%d\n" % len(body) + body


@dataclass
class Staged:
    sent: int                     # bytes of objects sent (what the store lacked)
    reused: bool                  # the folder at `final` was used as it is
    smoke_error: str | None       # the `then` process did not start: why
    smoke_kept: bool = False      # reused: the prestage's runner (same input, passed or running) kept
    smoke_reused: dict | None = None   # {"release", "started"}: a kept verdict replayed (nothing changed since)


def stage(t: TransportLike, python: str, rundir: str, plan: Plan, timeout: float = 300) -> Staged:
    """Run PROGRAM on the host in one command, answering its request for missing objects."""
    script = files.python_c(python, PROGRAM, rundir=rundir)
    take = getattr(t, "take_prelude", None)     # a deploy's carrier: its deferred ledger lines ride here
    prelude = take() if take is not None else None
    chan = t.open_exec(script, prelude=prelude)
    ex = Exchange(chan, t.name, f"stage {plan.final}", timeout)
    sent = 0
    try:
        ex.send(plan.header())
        asked = ex.line_starting(NEED.encode())
        for digest in (asked.split()[1:] if asked else []):
            if digest not in plan.blobs:
                raise RemoteError(f"{t.name}: staging {plan.final}: the host asked for an unknown object {digest[:80]}")
            ex.send(plan.blobs[digest])
            sent += len(plan.blobs[digest])
        ex.shutdown_write()
        rc = ex.finish()
    finally:
        close_quietly(chan)
    result = CommandResult(f"stage {plan.final}", rc, ex.out.decode("utf-8", "replace"),
                           ex.err.decode("utf-8", "replace"))
    if prelude is not None:
        result = prelude.settle(result)     # raises when the ledger lines could not be written
    return _parse(t.name, plan.final, result, ex.lost, sent)


def _parse(host: str, final: str, r: CommandResult, lost: str | None, sent: int) -> Staged:
    done = [ln for ln in r.stdout.splitlines() if ln.startswith(DONE)]
    if r.rc != 0 or not done:
        said = [ln[len(FAILED):] for ln in r.stderr.splitlines() if ln.startswith(FAILED)]
        detail = (said or r.stderr.strip().splitlines()[-1:] or [lost or f"exit {r.rc}"])[-1]
        raise RemoteError(f"{host}: staging {final} failed (exit {r.rc}): {detail[:400]}")
    verdict = hostjson.loads_object(done[-1][len(DONE):], "the stage verdict")
    return Staged(0 if verdict["reused"] else sent, bool(verdict["reused"]), verdict.get("smoke_error"),
                  bool(verdict.get("smoke_kept")), verdict.get("smoke_reused"))

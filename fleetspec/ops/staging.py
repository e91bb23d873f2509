"""Stage a release: send what the host lacks, build releases/<id>/ in a temp folder, verify it
(hashes, py_compile), then rename it into place. Nothing that runs changes here."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from fleetspec.errors import FleetspecError
from fleetspec.model import ledger as L
from fleetspec.model.release import BASELINE, Release
from fleetspec.ops.hoststate import HostState
from fleetspec.remote import files, overlay, release_files
from fleetspec.remote.api import TransportLike

if TYPE_CHECKING:
    from fleetspec.ops.preflight import Preflight

SECRETS_FILE = "secrets/env"      # in the release folder: the folder 0700, the file 0600


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload_objects(t: TransportLike, state: HostState, blobs: dict[str, bytes]) -> int:
    """Send each blob the host lacks into the content-addressed store; return bytes sent."""
    store = str(state.layout.objects)
    if not blobs:
        return 0
    sent = 0
    for digest in files.missing_from_store(t, store, sorted(blobs)):
        t.put_bytes(blobs[digest], f"{store}/{digest}", mode=0o644, durable=False)   # hash-checked where used
        sent += len(blobs[digest])
    return sent


def stage(t: TransportLike, pf: Preflight, state: HostState, release_id: str, previous: str | None, *,
          mode: str, reuse: bool = False) -> tuple[Release, int | None]:
    """Build releases/<id>/ from scratch in a temp folder, verify it, then rename it into place.
    Returns the release and the bytes sent to the host (what it already held is not sent again);
    `reuse` (a release --prestage staged under this id): None bytes when it was used as it is."""
    final = str(state.layout.release(release_id))
    tmp = final + files.TMP_SUFFIX
    patch_files = pf.patch_files()          # package path -> bytes
    kernel_files = pf.kernel_files()        # file name -> bytes
    if reuse:
        planned = new_release(pf, release_id, previous, mode, patch_files, kernel_files)
        if prestaged_as_planned(t, state, planned, pf.secret_values()):
            return planned, None
    sent = upload_objects(t, state, {sha(b): b for b in [*patch_files.values(), *kernel_files.values()]})
    # in-place mode too: the smoke tests run against the overlay before the switch; the overlay
    # script (`set -eu`) checks each file's sha256, so copies and overlay are one command
    then = overlay.overlay_script(pf.sglang.site_packages, f"{tmp}/patch", f"{tmp}/overlay", pf.patchset) \
        if patch_files else None
    release_files.copy_from_store(t, tmp, str(state.layout.objects), {p: sha(b) for p, b in patch_files.items()},
                                  {n: sha(b) for n, b in kernel_files.items()}, then=then)
    if patch_files:
        _py_compile(t, pf, [f"{tmp}/overlay/{p}" for p in patch_files if p.endswith(".py")])
    release = new_release(pf, release_id, previous, mode, patch_files, kernel_files)
    secrets = pf.secret_values()
    if secrets:
        files.make_dirs(t, tmp + "/secrets")
        t.put_bytes(env_file_text(secrets).encode(), f"{tmp}/{SECRETS_FILE}", mode=0o600, durable=False)
    t.put_bytes(release.to_json().encode(), f"{tmp}/manifest.json", mode=0o644, durable=False)
    # `current` may point here after a power cut only at a whole release.
    files.publish_tree(t, tmp, final)
    return release, sent


def prestaged_as_planned(t: TransportLike, state: HostState, planned: Release, secrets: dict[str, str]) -> bool:
    """A release staged earlier under this id (--prestage) is used as it is only when the ledger
    still calls it just "staged" (no other deploy abandoned it since) and its manifest and secrets
    file are byte for byte what this deploy would write now; otherwise it is staged again."""
    if state.ledger().releases().get(planned.id) != L.STAGED:
        return False
    base, sep = str(state.layout.release(planned.id)), "__FLEETSPEC_SEP__"
    got = t.run_script(f"{files.read_optional(base + '/manifest.json')}; printf '\\n%s\\n' {sep}; "
                       f"{files.read_optional(base + '/' + SECRETS_FILE)}", timeout=30, check=True).stdout
    manifest, _, secrets_text = got.partition(f"\n{sep}\n")
    want = env_file_text(secrets) if secrets else files.ABSENT
    return manifest == planned.to_json() and secrets_text == want


def new_release(pf: Preflight, release_id: str, previous: str | None, mode: str,
                patch_files: dict[str, bytes], kernel_files: dict[str, bytes]) -> Release:
    return Release(
        id=release_id, host=pf.host.name, service=pf.service, algo=pf.playbook.algo, mode=mode,
        sglang_version=pf.sglang.version, argv=pf.new_argv, previous=previous or BASELINE,
        patchset=pf.patchset_name, files={p: sha(b) for p, b in patch_files.items()},
        kernels={n: sha(b) for n, b in kernel_files.items()}, options=dict(pf.options.values),
        notes=list(pf.notes), site_packages=pf.sglang.site_packages,
        base_files={f.path: f.base_sha256 for f in pf.patchset.files} if pf.patchset else {},
        exec_prefix=pf.exec_prefix, exec_path=pf.exec_path,
        launch=pf.launch.to_dict() if pf.launch else {},
    )


def env_file_text(values: dict[str, str]) -> str:
    """An EnvironmentFile= body: NAME="value", with \\ " ` $ escaped as systemd's parser wants."""
    def esc(v: str) -> str:
        return "".join("\\" + c if c in '\\"`$' else c for c in v)
    return "".join(f'{k}="{esc(v)}"\n' for k, v in values.items())


def _py_compile(t: TransportLike, pf: Preflight, paths: list[str]) -> None:
    if not paths:
        return
    code = "import py_compile,sys\nfor p in sys.argv[1:]: py_compile.compile(p, doraise=True, cfile=None)"
    r = files.run_python(t, pf.python, code, paths, rundir=str(pf.layout.run), timeout=300)
    if r.rc != 0:
        raise FleetspecError(f"py_compile failed on the host: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")

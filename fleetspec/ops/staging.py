"""Stage a release: send what the host lacks, build releases/<id>/ in a temp folder, verify it
(hashes, py_compile), rename it into place and start its smoke runner, all in one command
(remote/stage_host.py). Nothing that runs changes here."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetspec.model import container_launch
from fleetspec.model import ledger as L
from fleetspec.model.names import is_name
from fleetspec.model.release import BASELINE, Release
from fleetspec.ops.hoststate import HostState
from fleetspec.remote import files, overlay, stage_host
from fleetspec.remote.api import TransportLike

if TYPE_CHECKING:
    from fleetspec.ops.preflight_result import Preflight

SECRETS_FILE = "secrets/env"      # in the release folder: the folder 0700, the file 0600


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Staged:
    release: Release
    sent: int | None                # bytes of objects sent; None: a prestaged folder used as it is
    smoke_error: str | None = None  # the smoke runner (`then`) did not start: why
    smoke_kept: bool = False        # the prestage's runner, same input, passed or running: its verdict is ours
    smoke_reused: dict | None = None   # a kept verdict replayed: {"release" that ran it, "started": epoch s}


def stage(t: TransportLike, pf: Preflight, state: HostState, release_id: str, previous: str | None, *,
          mode: str, reuse: bool = False, ledger: L.ParsedLedger | None = None,
          then: stage_host.Then | None = None) -> Staged:
    """Build releases/<id>/ aside, verify it, rename it into place and then start `then` (the smoke
    runner), in one command (remote/stage_host.py); only the objects the host lacks are sent.
    `reuse` (a release --prestage staged under this id): the folder is used as it is when the
    ledger (`ledger`: as read under the lock) still calls it "staged" and its manifest.json and
    secrets/env are what this deploy would write; otherwise it is staged afresh under the same id."""
    final = str(state.layout.release(release_id))
    tmp = final + files.TMP_SUFFIX
    patch_files = pf.patch_files()          # package path -> bytes
    kernel_files = pf.kernel_files()        # file name -> bytes
    release = new_release(pf, release_id, previous, mode, patch_files, kernel_files)
    secrets = pf.secret_values()
    # in-place mode too: the smoke tests run against the overlay before the switch; the overlay
    # script (`set -eu`) checks each file's sha256 after the copies
    plan = stage_host.Plan(
        store=str(state.layout.objects), final=final,
        blobs={sha(b): b for b in [*patch_files.values(), *kernel_files.values()]},
        patch={p: sha(b) for p, b in patch_files.items()}, kernels={n: sha(b) for n, b in kernel_files.items()},
        overlay=overlay.overlay_script(pf.site_packages, f"{tmp}/patch", f"{tmp}/overlay", pf.patchset)
        if patch_files else None,
        compile=[f"overlay/{p}" for p in sorted(patch_files) if p.endswith(".py")],
        manifest=release.to_json(), secrets=env_file_text(secrets) if secrets else None,
        reuse=reuse and still_staged(state, release_id, ledger), then=then)
    done = stage_host.stage(t, pf.python, str(pf.layout.run), plan)
    return Staged(release, None if done.reused else done.sent, done.smoke_error, done.smoke_kept, done.smoke_reused)


def still_staged(state: HostState, release_id: str, ledger: L.ParsedLedger | None = None) -> bool:
    """A prestaged release is taken only while the ledger's latest status for it is "staged" (no
    other deploy abandoned it since)."""
    return (ledger if ledger is not None else state.ledger()).releases().get(release_id) == L.STAGED


def new_release(pf: Preflight, release_id: str, previous: str | None = None, mode: str = "release",
                patch_files: dict[str, bytes] | None = None, kernel_files: dict[str, bytes] | None = None) -> Release:
    """The one way a Release is made from what preflight decided: the deploy's, and the one --plan
    and the template check render (`<new>`). Files default to the patch set's and kernels' own."""
    patch_files = pf.patch_files() if patch_files is None else patch_files
    kernel_files = pf.kernel_files() if kernel_files is None else kernel_files
    release = Release(
        id=release_id, host=pf.host.name, service=pf.service, algo=pf.playbook.algo, mode=mode,
        sglang_version=pf.sglang_version, argv=pf.new_argv, previous=previous or BASELINE,
        patchset=pf.patchset_name, files={p: sha(b) for p, b in patch_files.items()},
        kernels={n: sha(b) for n, b in kernel_files.items()}, options=dict(pf.options.values),
        notes=list(pf.notes), site_packages=pf.site_packages,
        base_files={f.path: f.base_sha256 for f in pf.patchset.files} if pf.patchset else {},
        exec_prefix=pf.exec_prefix, exec_path=pf.exec_path,
        launch=pf.launch.to_dict(),
    )
    if pf.container is None:
        return release
    # a container unit: the runtime words kept, only the release folder mounted (read-only), labelled
    rdir = str(pf.layout.release(release_id))
    return dataclasses.replace(release, argv=container_launch.with_release(
        pf.container, pf.new_argv, release_id=release_id, release_dir=rdir, env=pf.environment(release, rdir),
        drop_env=pf.launch.env_dropped))


def env_file_text(values: dict[str, str]) -> str:
    """An EnvironmentFile= body: NAME="value", with \\ " ` $ escaped as systemd's parser wants."""
    def esc(v: str) -> str:
        return "".join("\\" + c if c in '\\"`$' else c for c in v)
    return "".join(f'{k}="{esc(v)}"\n' for k, v in values.items())


def abandon_unswitched(state: HostState, running: str, ledger: L.ParsedLedger | None = None) -> list[str]:
    """Mark deploys that died before `switch` as failed: they changed nothing that runs. A smoke
    runner one of them left in the background is killed (by its recorded pid, if still its own)."""
    from fleetspec.ops.smoke_run import stop as stop_smoke

    ledger = ledger if ledger is not None else state.ledger()
    ahead = set(ledger.staged_ahead())
    out = []
    for rid in ledger.interrupted():
        if rid != running and ledger.releases()[rid] != L.SWITCHED:
            if is_name(rid):
                stop_smoke(state.t, state, rid)
            reason = (f"staged ahead, never switched: superseded by {running}; host unchanged" if rid in ahead
                      else "interrupted before switch; host unchanged")
            state.record(L.Entry.status(rid, L.FAILED, reason=reason))
            out.append(rid)
    return out

"""fleetspec's own state on one host for one service: ledger, baseline, releases, current.

Every write is temp-then-rename (or a single O_APPEND line for the ledger), fsynced with its
folder, and the ledger is mirrored to the fleet root's .fleetspec/ folder, so a host that dies
keeps its story locally too. The state folders are root-only (0700) and the baseline's copies of
the unit and drop-ins keep their source's mode or tighter (a drop-in may hold a token).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from fleetspec.errors import RemoteError
from fleetspec.model import hostjson
from fleetspec.model import ledger as ledger_model
from fleetspec.model.baseline import Baseline
from fleetspec.model.layout import STATE_ROOT, HostLayout
from fleetspec.model.names import is_name
from fleetspec.model.release import Release
from fleetspec.remote import files, ledger_files
from fleetspec.remote.api import CommandResult, TransportLike
from fleetspec.remote.carrier import Carrying
from fleetspec.remote.lock import RemoteLock

ABSENT = files.ABSENT
IDENTITY = "identity.json"     # in the mirror: the host key the copy was taken from
# systemd applies a unit's drop-ins sorted by file name, the last ExecStart= winning: fleetspec's
# sorts after every usual admin name (NN-*.conf, override.conf from `systemctl edit`). Releases made
# before the rename used 50-fleetspec.conf; switching and rollback remove that name, status reads both.
DROPIN_NAME = "zz-fleetspec.conf"
LEGACY_DROPIN_NAMES = ("50-fleetspec.conf",)
DROPIN_NAMES = (DROPIN_NAME, *LEGACY_DROPIN_NAMES)


def dropin_path(service: str, name: str = DROPIN_NAME) -> str:
    return f"/etc/systemd/system/{service}.d/{name}"


def legacy_dropin_paths(service: str) -> list[str]:
    return [dropin_path(service, n) for n in LEGACY_DROPIN_NAMES]


def is_ours(path: str) -> bool:
    return PurePosixPath(path).name in DROPIN_NAMES


def sorts_after_ours(path: str) -> bool:
    """An admin drop-in that systemd applies after fleetspec's (so its ExecStart= would win)."""
    name = PurePosixPath(path).name
    return not is_ours(path) and name.encode() > DROPIN_NAME.encode()


@dataclass
class HostState:
    t: TransportLike
    host: str
    service: str
    mirror: Path | None = None    # local folder for the ledger/baseline copies
    redact: Callable[[str], str] | None = None   # secrets out of every ledger line (set by deploy)
    lock: RemoteLock | None = None  # held by this operation: every ledger line
                                  # (each step starts with one) first checks it is still ours
    root: PurePosixPath = STATE_ROOT   # the host's state root (tests point it at a scratch folder)
    rollout: str | None = None    # the rollout this operation belongs to: named in each ledger line's detail

    def __post_init__(self):
        self.layout = HostLayout(self.service, PurePosixPath(self.root))
        self.dropin = dropin_path(self.service)
        self.repaired: str | None = None       # said by read_baseline when it put the baseline back
        self.pending: list[ledger_model.Entry] = []
        self.broken: RemoteError | None = None     # a prelude's write failed: the carrier stops
        self._sent_ids: set[int] = set()
        self.written: list[str] = []           # the ledger lines this state appended, in order

    @property
    def io(self) -> Carrying:
        """The transport for this state's own reads and writes: it carries the deferred lines."""
        return self.carrier()

    # ledger -----------------------------------------------------------------------------
    def defer(self, entry: ledger_model.Entry) -> None:
        """Keep a line to travel with the next record() or the next command sent through
        carrier() (its prelude). Only for a line whose delay changes no decision."""
        self.pending.append(entry)

    def discard(self, entry: ledger_model.Entry) -> None:
        """Take back a deferred line not sent yet (its act never happened)."""
        self.pending = [e for e in self.pending if e is not entry]

    def was_sent(self, entry: ledger_model.Entry) -> bool:
        return id(entry) in self._sent_ids

    def flush(self) -> None:
        if self.pending:
            self.record(None)

    def record(self, entry: ledger_model.Entry | None) -> None:
        """Append the deferred lines and `entry`, in order, in one command (each line its own
        O_APPEND write)."""
        entries, self.pending = [*self.pending, *([entry] if entry is not None else [])], []
        lines = self._lines(entries)
        guard = self.lock.guard() if self.lock is not None else ""
        r = files.append_private_lines(self.t, str(self.layout.base), str(self.layout.ledger), lines, guard)
        self._settle(entries, lines, r)

    def prelude(self) -> "LedgerPrelude | None":
        """The deferred lines as a prelude for the next command (None when there are none): the
        lock guard and the appends run first in that command's shell, apart from it."""
        if self.broken is not None:
            raise self.broken
        if not self.pending:
            return None
        entries, self.pending = self.pending, []
        lines = self._lines(entries)
        guard = self.lock.guard() if self.lock is not None else ""
        script = files.prelude_script(guard, str(self.layout.base), str(self.layout.ledger), lines)
        return LedgerPrelude(script, lambda r: self._settle_prelude(entries, lines, r))

    def carrier(self) -> Carrying:
        """A transport whose commands carry the deferred lines (remote/carrier.py)."""
        return Carrying(self.t, self.prelude, self.flush, str(self.root))

    def _lines(self, entries: list[ledger_model.Entry]) -> list[str]:
        if self.rollout is not None:
            entries = [e if "rollout" in e.detail or e.kind == ledger_model.ROUTER
                       else dataclasses.replace(e, detail={**e.detail, "rollout": self.rollout}) for e in entries]
        lines = [e.to_line() for e in entries]
        return [self.redact(line) for line in lines] if self.redact is not None else lines

    def _settle_prelude(self, entries, lines, r: CommandResult) -> CommandResult:
        marks = [ln for ln in r.stderr.splitlines() if ln.startswith(PRELUDE_MARKER + " ")]
        if r.rc != PRELUDE_FAILED or not marks:
            self._settle(entries, lines, CommandResult(r.command, 0, "", ""))
            return r
        rc = int(marks[-1].split()[1]) if marks[-1].split()[1:2] and marks[-1].split()[1].isdigit() else 1
        stderr = "\n".join(ln for ln in r.stderr.splitlines() if not ln.startswith(PRELUDE_MARKER + " "))
        try:
            self._settle(entries, lines, CommandResult(r.command, rc or 1, "", stderr))
        except RemoteError as err:
            self.broken = err                  # nothing more goes out through the carrier
            raise
        return r

    def _settle(self, entries, lines, r: CommandResult) -> None:
        """After an append: LockLost (nothing written) or LedgerWriteFailed, each naming the step
        the failure is charged to; else the mirror gets the lines too."""
        try:
            if self.lock is not None:
                self.lock.check(r)             # LockLost: nothing written, the caller stops
            if r.rc != 0:
                detail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or [f"exit {r.rc}"]
                raise LedgerWriteFailed(f"{self.host}: appending to {self.layout.ledger} exited {r.rc}: "
                                        f"{detail[0][:300]}")
        except RemoteError as err:
            err.charged_step = charged_step(entries)
            raise
        self._sent_ids.update(id(e) for e in entries)
        self.appended(lines)

    def supersede_staged(self, older, by: str) -> None:
        """Mark releases staged ahead and never switched to as superseded by `by`: one staged
        release per algo, and pruning counts the older ones with the finished releases instead of
        keeping them on the host for ever."""
        for rid in older:
            if rid != by:
                self.record(ledger_model.Entry.status(rid, ledger_model.SUPERSEDED, reason=f"staged again as {by}"))

    def appended(self, lines: list[str]) -> None:
        """Lines appended on the host (by a prelude or by a command's own script): known as
        written, and mirrored."""
        self.written.extend(lines)
        if self.mirror:
            append_private(self.mirror / "ledger.jsonl", "".join(line + "\n" for line in lines))

    def line(self, entry: ledger_model.Entry) -> str:
        """`entry` as its ledger line (redacted)."""
        return self._lines([entry])[0]

    def ledger(self) -> ledger_model.ParsedLedger:
        return ledger_model.parse(files.read_text(self.io, str(self.layout.ledger)) or "")

    def ledger_with_archive(self) -> ledger_model.ParsedLedger:
        """Every line ever written, each once: the archive's files (oldest first, see
        remote/ledger_files.py) and then the ledger, in one command. For `history`; a deploy
        needs the ledger alone. `skipped` numbers the ledger's own torn lines, as in its file."""
        archived, current = ledger_files.read_with_archive(self.io, self.layout)
        merged = ledger_model.parse(ledger_model.without_repeats(archived + current))
        return dataclasses.replace(merged, skipped=ledger_model.parse(current).skipped, numbers=())

    # baseline ---------------------------------------------------------------------------
    @property
    def baseline_json(self) -> str:
        return str(self.layout.baseline / "baseline.json")

    @property
    def lock_reads(self) -> dict:
        """RemoteLock's read= and link= for deploy and rollback: the ledger (lock.read_text),
        baseline.json and `current`, read by the holder once it holds the lock."""
        return {"read": [str(self.layout.ledger), self.baseline_json], "link": str(self.layout.current)}

    def read_baseline(self, repair: bool = True) -> Baseline | None:
        """The recorded baseline. A host copy that no longer verifies (its own sha256s) is put back
        from the fleet root's mirror when that one verifies (`repair`, under the lock; else the
        mirror's copy is only read); otherwise it is refused, never guessed."""
        path = str(self.layout.baseline / "baseline.json")
        return self.baseline_from_text(files.read_text(self.io, path), repair=repair)

    def baseline_from_text(self, text: str | None, repair: bool = False) -> Baseline | None:
        """read_baseline's verdict on baseline.json's text already read (status reads it with its
        other facts, in one round trip)."""
        path = str(self.layout.baseline / "baseline.json")
        if text is None:
            return None
        try:
            return Baseline.from_json(text)
        except (ValueError, KeyError, TypeError) as err:
            problem = f"{type(err).__name__}: {err}"
        local = self.mirror / "baseline.json" if self.mirror else None
        try:
            good = Baseline.from_json(local.read_text()) if local and local.is_file() else None
        except (ValueError, KeyError, TypeError):
            good = None
        other = self.mirror_from_elsewhere() if good is not None else None
        if good is None or good.service != self.service or other:
            from fleetspec.errors import NeedsAttention

            raise NeedsAttention(f"{self.host}: the baseline {path} is corrupt ({problem[:120]}) and this fleet "
                                 f"root holds no verified copy of it{other or ''}; restore it from a backup, or if "
                                 f"the service is on its original setup now, record that",
                                 f"fleetspec baseline {self.host} --retake")
        if repair:
            self.write_baseline(good, replace=True)
            self.record(ledger_model.Entry.step("baseline", "repair", "ok", reason=problem[:200],
                                                from_mirror=str(local), unit_sha256=good.unit_sha256))
            self.repaired = f"{self.host}: the baseline on the host was corrupt ({problem[:80]}); repaired from {local}"
        return good

    def identity(self) -> str | None:
        """The host key this connection saw (None for a transport that has none to show)."""
        key = getattr(self.t, "host_key", None)
        return key() if callable(key) else None

    def mirror_from_elsewhere(self) -> str | None:
        """Why the mirror's baseline may be another machine's (None when it is this one's): it
        must carry the host key this connection sees, recorded when it was written."""
        if self.mirror is None:
            return None
        try:
            recorded = hostjson.loads_object((self.mirror / IDENTITY).read_text(), IDENTITY).get("host_key")
        except (OSError, ValueError):
            recorded = None
        seen = self.identity()
        if recorded is None or seen is None or recorded != seen:
            return (f" (the copy in {self.mirror} was taken from host key {recorded or 'unrecorded'}, this host "
                    f"shows {seen or 'none'}: it may be another machine's)")
        return None

    def file_modes(self, paths: list[str]) -> dict[str, int]:
        """Permission bits of the files that exist among `paths`."""
        return files.file_modes(self.io, paths)

    def write_baseline(self, baseline: Baseline, *, replace: bool = False) -> Baseline:
        """Build baseline.tmp/, then rename it into place: a baseline is whole or absent. The
        folder is 0700, baseline.json (it holds every drop-in's bytes) 0600, and each copy of the
        unit or a drop-in its source's mode without group/other bits; the modes are recorded so that
        a rollback restores each file with the mode it had. Returns the baseline as written."""
        if not baseline.modes:
            baseline = dataclasses.replace(baseline, modes=self.file_modes([baseline.unit_path, *baseline.sources,
                                                                            *baseline.dropins]))
        base = str(self.layout.baseline)
        tmp = base + files.TMP_SUFFIX
        files.fresh_private_tree(self.io, str(self.layout.base), tmp, ("dropins", "sources"))
        self.io.put_bytes(baseline.to_json().encode(), f"{tmp}/baseline.json", mode=0o600)
        self.io.put_bytes(baseline.unit_bytes, f"{tmp}/unit", mode=copy_mode(baseline.modes.get(baseline.unit_path)))
        for i, (path, data) in enumerate(sorted(baseline.dropins.items())):
            self.io.put_bytes(data, f"{tmp}/dropins/{i:02d}-{Path(path).name}", mode=copy_mode(baseline.modes.get(path)))
        for i, (path, data) in enumerate(sorted(baseline.sources.items())):
            self.io.put_bytes(data, f"{tmp}/sources/{i:02d}-{Path(path).name}", mode=copy_mode(baseline.modes.get(path)))
        files.rename_into_place(self.io, tmp, base, replace=replace)
        if self.mirror:
            write_private(self.mirror / "baseline.json", baseline.to_json().encode())
            write_private(self.mirror / IDENTITY, json.dumps({"host": self.host, "host_key": self.identity()}).encode())
        return baseline

    # releases ---------------------------------------------------------------------------
    def current(self, link: str | None = None) -> str | None:
        """The release `current` points at, or None (the baseline); `link`: readlink's output
        already read (facts.link_target in a batch)."""
        out = files.readlink(self.io, str(self.layout.current)) if link is None else link
        if not out:
            return None
        name = PurePosixPath(out).name
        if not is_name(name) or PurePosixPath(out).parent != self.layout.releases:
            raise RemoteError(f"{self.host}: {self.layout.current} points at {out!r}, not at a release folder "
                              f"of {self.layout.releases}; refusing to use it")
        return name

    def read_release(self, release_id: str) -> Release:
        path = self.layout.release(_release_name(release_id, self.host)) / "manifest.json"
        try:
            return Release.from_json(self.io.get_bytes(str(path)).decode())
        except (ValueError, TypeError, KeyError) as err:
            raise RemoteError(f"{self.host}: {path} is not a valid release manifest: {str(err)[:200]}") from None

    def release_exists(self, release_id: str) -> bool:
        path = self.layout.release(_release_name(release_id, self.host)) / "manifest.json"
        return files.is_file(self.io, str(path))


PRELUDE_FAILED, PRELUDE_MARKER = files.PRELUDE_FAILED, files.PRELUDE_MARKER


class LedgerWriteFailed(RemoteError):
    """Appending the ledger failed (disk full, read-only): the step it is charged to stops there."""


def charged_step(entries: list[ledger_model.Entry]) -> str | None:
    """The step a failed write is charged to: the first step whose "ok" line it carried (that step
    did not end as recorded), else the first step whose "started" line it carried."""
    for state in (ledger_model.StepState.OK, ledger_model.StepState.STARTED):
        for e in entries:
            if e.kind == "step" and e.state == state:
                return e.name
    return None


@dataclass
class LedgerPrelude:
    script: str
    settle: Callable[[CommandResult], CommandResult]


def _release_name(release_id: str, host: str) -> str:
    if not is_name(release_id):
        raise RemoteError(f"{host}: {release_id!r} is not a release id; refusing to use it as a path")
    return release_id


def copy_mode(source: int | None) -> int:
    """A baseline copy's mode: its source's owner bits (read/write only), never group or other."""
    return (source & 0o600) if source is not None else 0o600


def write_private(path: Path, data: bytes) -> None:
    """Write a local file 0600 in a 0700 folder, atomically and durably (temp, fsync, rename, fsync
    the folder): the mirror holds the baseline, and with it every drop-in's bytes."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def append_private(path: Path, text: str) -> None:
    """Append to a local 0600 file in a 0700 folder, fsynced (file, and folder when created)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""fleetspec's own state on one host for one service: ledger, baseline, releases, current.

Every write is temp-then-rename (or a single O_APPEND line for the ledger) and the ledger is
mirrored to the fleet root's .fleetspec/ folder, so a host that dies keeps its story locally too.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fleetspec.model import ledger as ledger_model
from fleetspec.model.baseline import Baseline
from fleetspec.model.layout import HostLayout
from fleetspec.model.release import BASELINE, Release
from fleetspec.remote import files

q = shlex.quote
ABSENT = "__FLEETSPEC_ABSENT__"
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
    t: object                     # remote.transport.Transport
    host: str
    service: str
    mirror: Path | None = None    # local folder for the ledger/baseline copies
    redact: object = None         # text -> text: secrets out of every ledger line (set by deploy)

    def __post_init__(self):
        self.layout = HostLayout(self.service)
        self.dropin = dropin_path(self.service)
        self.repaired: str | None = None       # said by read_baseline when it put the baseline back

    # ledger -----------------------------------------------------------------------------
    def record(self, entry: ledger_model.Entry) -> None:
        line = entry.to_line()
        if self.redact is not None:
            line = self.redact(line)
        self.t.run_script(f"mkdir -p {q(str(self.layout.base))} && chmod 0755 {q(str(self.layout.base))} && "
                          + files.append_line(str(self.layout.ledger), line), timeout=30, check=True)
        if self.mirror:
            self.mirror.mkdir(parents=True, exist_ok=True)
            with open(self.mirror / "ledger.jsonl", "a") as fh:
                fh.write(line + "\n")

    def ledger(self) -> ledger_model.ParsedLedger:
        text = self.t.run_script(files.read_optional(str(self.layout.ledger), ""), timeout=30, check=True).stdout
        return ledger_model.parse(text)

    # baseline ---------------------------------------------------------------------------
    def read_baseline(self, repair: bool = True) -> Baseline | None:
        """The recorded baseline. A host copy that no longer verifies (its own sha256s) is put back
        from the fleet root's mirror when that one verifies (`repair`, under the lock; else the
        mirror's copy is only read); otherwise it is refused, never guessed."""
        path = str(self.layout.baseline / "baseline.json")
        text = self.t.run_script(files.read_optional(path, ABSENT), timeout=30, check=True).stdout
        return self.baseline_from_text(None if text == ABSENT else text, repair=repair)

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
        if good is None or good.service != self.service:
            from fleetspec.errors import NeedsAttention

            raise NeedsAttention(f"{self.host}: the baseline {path} is corrupt ({problem[:120]}) and this fleet "
                                 f"root holds no verified copy of it; restore it from a backup, or if the service "
                                 f"is on its original setup now, record that",
                                 f"fleetspec baseline {self.host} --retake")
        if repair:
            self.write_baseline(good, replace=True)
            self.record(ledger_model.Entry.step("baseline", "repair", "ok", reason=problem[:200],
                                                from_mirror=str(local), unit_sha256=good.unit_sha256))
            self.repaired = f"{self.host}: the baseline on the host was corrupt ({problem[:80]}); repaired from {local}"
        return good

    def write_baseline(self, baseline: Baseline, *, replace: bool = False) -> None:
        """Build baseline.tmp/, then rename it into place: a baseline is whole or absent."""
        base = str(self.layout.baseline)
        tmp = base + files.TMP_SUFFIX
        self.t.run_script(f"rm -rf {q(tmp)} && mkdir -p {q(tmp)}/dropins", timeout=30, check=True)
        self.t.put_bytes(baseline.to_json().encode(), f"{tmp}/baseline.json", mode=0o644)
        self.t.put_bytes(baseline.unit_bytes, f"{tmp}/unit", mode=0o644)
        for i, (path, data) in enumerate(sorted(baseline.dropins.items())):
            self.t.put_bytes(data, f"{tmp}/dropins/{i:02d}-{Path(path).name}", mode=0o644)
        if replace:
            old = base + ".old"
            self.t.run_script(f"rm -rf {q(old)}; if [ -d {q(base)} ]; then mv -T {q(base)} {q(old)}; fi && "
                              f"mv -T {q(tmp)} {q(base)} && rm -rf {q(old)}", timeout=30, check=True)
        else:
            self.t.run_script(f"[ ! -e {q(base)} ] && mv -T {q(tmp)} {q(base)}", timeout=30, check=True)
        if self.mirror:
            self.mirror.mkdir(parents=True, exist_ok=True)
            (self.mirror / "baseline.json").write_text(baseline.to_json())

    # releases ---------------------------------------------------------------------------
    def current(self) -> str | None:
        """The release `current` points at, or None (the baseline)."""
        out = self.t.run_script(f"readlink {q(str(self.layout.current))} || true", timeout=30, check=True).stdout.strip()
        return Path(out).name if out else None

    def read_release(self, release_id: str) -> Release:
        path = self.layout.release(release_id) / "manifest.json"
        return Release.from_json(self.t.get_bytes(str(path)).decode())

    def release_exists(self, release_id: str) -> bool:
        path = self.layout.release(release_id) / "manifest.json"
        return self.t.run_script(f"test -f {q(str(path))}", timeout=30, check=False).rc == 0

    def healthy_releases(self) -> list[str]:
        return [r for r, s in self.ledger().releases().items() if s == ledger_model.HEALTHY]

    def dropin_bytes(self) -> bytes | None:
        """fleetspec's drop-in as on the host now (under its current or its legacy name)."""
        for path in (self.dropin, *legacy_dropin_paths(self.service)):
            text = self.t.run_script(files.read_optional(path, ABSENT), timeout=30, check=True).stdout
            if text != ABSENT:
                return text.encode()
        return None

    def target_label(self, release_id: str | None) -> str:
        return release_id or BASELINE


def load_json(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        return {}

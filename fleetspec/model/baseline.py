"""The baseline: the service exactly as fleetspec first found it. Written once; rollback returns to it."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass, field


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Baseline:
    service: str
    unit_path: str
    unit_bytes: bytes
    dropins: dict[str, bytes]            # path -> bytes, admin drop-ins other than fleetspec's
    exec_argv: list[str]
    environment: list[str]
    sglang: dict                         # version, site_packages, python, drift
    served_algorithm: str | None         # resolved, from /server_info (e.g. EAGLE for NEXTN)
    declared_algorithm: str | None       # as the operator wrote it (e.g. NEXTN)
    taken_at: float = 0.0
    taken_by: str = ""
    notes: list[str] = field(default_factory=list)
    modes: dict[str, int] = field(default_factory=dict)   # path -> permission bits as found (restored so)

    @property
    def unit_sha256(self) -> str:
        return sha256(self.unit_bytes)

    def to_json(self) -> str:
        raw = asdict(self)
        raw["unit_bytes"] = base64.b64encode(self.unit_bytes).decode()
        raw["dropins"] = {p: base64.b64encode(b).decode() for p, b in self.dropins.items()}
        raw["unit_sha256"] = self.unit_sha256
        raw["dropins_sha256"] = {p: sha256(b) for p, b in self.dropins.items()}
        return json.dumps(raw, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Baseline":
        raw = json.loads(text)
        unit = base64.b64decode(raw.pop("unit_bytes"))
        if sha256(unit) != raw.pop("unit_sha256"):
            raise ValueError("baseline unit bytes do not match their recorded sha256")
        dropins = {p: base64.b64decode(b) for p, b in raw.pop("dropins").items()}
        expected = raw.pop("dropins_sha256")
        if {p: sha256(b) for p, b in dropins.items()} != expected:
            raise ValueError("baseline drop-ins do not match their recorded sha256")
        raw["modes"] = {str(p): int(m) & 0o7777 for p, m in (raw.get("modes") or {}).items()}
        return cls(unit_bytes=unit, dropins=dropins, **raw)

    def differences(self, unit_bytes: bytes, dropins: dict[str, bytes]) -> list[str]:
        """What changed by hand since the baseline (fleetspec's own drop-in is excluded by the caller)."""
        out = []
        if unit_bytes != self.unit_bytes:
            out.append(f"{self.unit_path} changed (sha256 {sha256(unit_bytes)[:12]}, baseline {self.unit_sha256[:12]})")
        for path in sorted(set(dropins) | set(self.dropins)):
            if dropins.get(path) != self.dropins.get(path):
                out.append(f"drop-in {path} {'added' if path not in self.dropins else 'removed' if path not in dropins else 'changed'}")
        return out

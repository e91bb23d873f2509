"""The baseline: the service exactly as fleetspec first found it. Written once; rollback returns to it."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any, Collection, Mapping

from fleetspec import secrets
from fleetspec.model import hostjson

REDACTED = secrets.PLACEHOLDER


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Baseline:
    service: str
    unit_path: str
    unit_bytes: bytes
    dropins: dict[str, bytes]            # path -> bytes, admin drop-ins other than fleetspec's
    exec_argv: list[str]
    environment: dict[str, str | None]   # name -> value from the unit and drop-ins; secrets REDACTED
                                         # (None: a baseline recorded before values were kept)
    sglang: dict[str, Any]               # version, site_packages, python, drift
    served_algorithm: str | None         # resolved, from /server_info (e.g. EAGLE for NEXTN)
    declared_algorithm: str | None       # as the operator wrote it (e.g. NEXTN)
    taken_at: float = 0.0
    taken_by: str = ""
    notes: list[str] = field(default_factory=list)
    modes: dict[str, int] = field(default_factory=dict)   # path -> permission bits as found (restored so)
    container: dict[str, Any] = field(default_factory=dict)  # a container unit's runtime, image, image_id, digest
    sources: dict[str, bytes] = field(default_factory=dict)  # path -> bytes a generator made the unit from (Quadlet)

    def container_changes(self, now: dict[str, Any] | None) -> list[str]:
        """The image the unit runs, changed since the baseline (a rollback must bring back this
        one: a different id or digest under the same name is drift, refused like a unit edit)."""
        if not self.container or not now:
            return []
        return [f"image {now.get('image')} {key} is {now.get(key)}, baseline {self.container.get(key)}"
                for key in ("image", "image_id", "digest") if now.get(key) != self.container.get(key)]

    @property
    def unit_sha256(self) -> str:
        return sha256(self.unit_bytes)

    def to_json(self) -> str:
        raw = asdict(self)
        raw["unit_bytes"] = base64.b64encode(self.unit_bytes).decode()
        raw["dropins"] = {p: base64.b64encode(b).decode() for p, b in self.dropins.items()}
        raw["unit_sha256"] = self.unit_sha256
        raw["dropins_sha256"] = {p: sha256(b) for p, b in self.dropins.items()}
        raw["sources"] = {p: base64.b64encode(b).decode() for p, b in self.sources.items()}
        raw["sources_sha256"] = {p: sha256(b) for p, b in self.sources.items()}
        return json.dumps(raw, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Baseline":
        raw = hostjson.loads_object(text, "baseline.json")
        unit = base64.b64decode(raw.pop("unit_bytes"))
        if sha256(unit) != raw.pop("unit_sha256"):
            raise ValueError("baseline unit bytes do not match their recorded sha256")
        dropins = {p: base64.b64decode(b) for p, b in raw.pop("dropins").items()}
        expected = raw.pop("dropins_sha256")
        if {p: sha256(b) for p, b in dropins.items()} != expected:
            raise ValueError("baseline drop-ins do not match their recorded sha256")
        sources = {p: base64.b64decode(b) for p, b in (raw.pop("sources", None) or {}).items()}
        if {p: sha256(b) for p, b in sources.items()} != (raw.pop("sources_sha256", None) or {}):
            raise ValueError("baseline sources do not match their recorded sha256")
        if isinstance(raw.get("environment"), list):     # names only (older baselines)
            raw["environment"] = {name: None for name in raw["environment"]}
        raw["modes"] = {str(p): int(m) & 0o7777 for p, m in (raw.get("modes") or {}).items()}
        return cls(unit_bytes=unit, dropins=dropins, sources=sources, **raw)

    def differences(self, unit_bytes: bytes, dropins: dict[str, bytes], secret_names: Collection[str] = (),
                    secret_values: Collection[str] = ()) -> list[str]:
        """What changed by hand since the baseline (fleetspec's own drop-in is excluded by the caller),
        down to each Environment variable's value (secret ones: only that they changed)."""
        out = []
        if unit_bytes != self.unit_bytes:
            out.append(f"{self.unit_path} changed (sha256 {sha256(unit_bytes)[:12]}, baseline {self.unit_sha256[:12]})")
        for path in sorted(set(dropins) | set(self.dropins)):
            if dropins.get(path) != self.dropins.get(path):
                out.append(f"drop-in {path} {'added' if path not in self.dropins else 'removed' if path not in dropins else 'changed'}")
        if out:
            out += environment_changes(unit_environment(self.unit_bytes, self.dropins),
                                       unit_environment(unit_bytes, dropins), secret_names, secret_values)
        return out


def is_secret(name: str, value: str | None = None, secret_names: Collection[str] = (),
              secret_values: Collection[str] = ()) -> bool:
    """A variable whose value is never shown: named in a secret list (the playbook's
    launch.secret_env, the inventory's api_key), named like one (*TOKEN*, *KEY*, *SECRET*,
    *PASSWORD* …), or holding a value fleetspec knows to be secret."""
    return (name in secret_names or secrets.is_secret_name(name)
            or (value is not None and value != "" and any(secret and secret in value for secret in secret_values)))


def unit_environment(unit_bytes: bytes, dropins: dict[str, bytes]) -> dict[str, str]:
    """Environment= of the unit and its drop-ins (in systemd's order: by file name), unredacted."""
    from fleetspec.systemd_unit import environment_of

    ordered = sorted(dropins.items(), key=lambda item: (PurePosixPath(item[0]).name, item[0]))
    return environment_of([unit_bytes.decode(errors="replace"), *(b.decode(errors="replace") for _, b in ordered)])


def recorded_environment(unit_bytes: bytes, dropins: dict[str, bytes], secret_names: Collection[str] = (),
                         secret_values: Collection[str] = ()) -> dict[str, str]:
    """What a baseline records: every variable's value, secret ones replaced by REDACTED."""
    env = unit_environment(unit_bytes, dropins)
    return {k: REDACTED if is_secret(k, v, secret_names, secret_values) else v for k, v in sorted(env.items())}


def environment_changes(old: Mapping[str, str | None], new: Mapping[str, str | None],
                        secret_names: Collection[str] = (), secret_values: Collection[str] = ()) -> list[str]:
    """One line per variable added, removed or changed; a secret's values are never shown."""
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        secret = is_secret(name, a, secret_names, secret_values) or is_secret(name, b, secret_names, secret_values)
        if name not in old:
            out.append(f"Environment {name} added" + ("" if secret else f" ({b!r})"))
        elif name not in new:
            out.append(f"Environment {name} removed" + ("" if secret else f" (was {a!r})"))
        else:
            out.append(f"Environment {name} changed" + (" (secret; values not shown)" if secret else f" ({a!r} -> {b!r})"))
    return out

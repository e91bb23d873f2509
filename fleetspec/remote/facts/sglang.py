"""The sglang install behind a host's python: version, where it lives, and whether its files are
still byte-identical to what pip recorded (dist-info RECORD: `path,sha256=<urlsafe b64>,size`).

Drift is what a patch set must refuse: someone edited site-packages by hand.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import shlex
from dataclasses import dataclass, field

# Runs in the host's python (3.8+), standard library only; prints one JSON object.
SNIPPET = r'''
import base64, hashlib, json, os, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0], "version": None,
       "site_packages": None, "dist_info": None, "drift": [], "missing": [], "files_checked": 0}
try:
    from importlib import metadata
    dist = metadata.distribution("sglang")
except Exception as err:
    out["error"] = "sglang not installed: %s" % (err,)
else:
    out["version"] = dist.version
    out["site_packages"] = str(dist.locate_file(""))
    out["dist_info"] = str(getattr(dist, "_path", "")) or None
    for f in dist.files or []:
        if f.hash is None or f.hash.mode != "sha256":
            continue
        path = str(f.locate())
        h = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        except FileNotFoundError:
            out["missing"].append(str(f))
            continue
        except OSError as err:
            out["drift"].append(str(f))
            continue
        out["files_checked"] += 1
        if base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode() != f.hash.value:
            out["drift"].append(str(f))
print(json.dumps(out))
'''


@dataclass
class SglangInstall:
    python: str
    python_version: str
    version: str | None
    site_packages: str | None
    dist_info: str | None = None
    drift: list[str] = field(default_factory=list)      # files whose bytes differ from RECORD
    missing: list[str] = field(default_factory=list)    # files RECORD lists that are gone
    files_checked: int = 0
    error: str | None = None

    @property
    def installed(self) -> bool:
        return self.version is not None

    @property
    def pristine(self) -> bool:
        return self.installed and not self.drift and not self.missing


def command(python: str) -> str:
    return f"{shlex.quote(python)} -c {shlex.quote(SNIPPET)}"


def parse(stdout: str, python: str = "") -> SglangInstall:
    data = json.loads(stdout.strip().splitlines()[-1])
    return SglangInstall(
        python=data["python"], python_version=data["python_version"], version=data.get("version"),
        site_packages=data.get("site_packages"), dist_info=data.get("dist_info"),
        drift=sorted(data.get("drift", [])), missing=sorted(data.get("missing", [])),
        files_checked=int(data.get("files_checked", 0)), error=data.get("error"))


@dataclass(frozen=True)
class RecordEntry:
    path: str
    sha256: str | None     # urlsafe base64 without padding, as RECORD stores it
    size: int | None


def parse_record(text: str) -> dict[str, RecordEntry]:
    """A dist-info RECORD (CSV) by path; entries without a hash (RECORD itself, .pyc) keep None."""
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        path, digest, size = (row + ["", ""])[:3]
        sha = None
        if digest:
            algo, _, value = digest.partition("=")
            if algo == "sha256":
                sha = value
        out[path] = RecordEntry(path, sha, int(size) if size.isdigit() else None)
    return out


def record_hash(data: bytes) -> str:
    """The RECORD form of a file's sha256 (urlsafe base64, no padding)."""
    import hashlib

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

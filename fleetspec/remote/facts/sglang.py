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
# Runs in the host's python (3.8+), standard library only; prints one JSON object.
# Hashing every file of sglang costs seconds of host CPU, so verdicts are cached on the host by
# each file's (size, mtime_ns, ctime_ns, inode), as git's index does: any write changes ctime, which
# no user can set back, so a cached verdict is only reused for a file nobody has written since.
SNIPPET = r'''
import base64, hashlib, json, os, sys
CACHE_DIR = os.environ.get("FLEETSPEC_FACT_CACHE", "/var/cache/fleetspec")
out = {"python": sys.executable, "python_version": sys.version.split()[0], "version": None,
       "site_packages": None, "dist_info": None, "drift": [], "missing": [], "files_checked": 0,
       "files_hashed": 0}
try:
    from importlib import metadata
    dist = metadata.distribution("sglang")
except Exception as err:
    out["error"] = "sglang not installed: %s" % (err,)
else:
    out["version"] = dist.version
    site = str(dist.locate_file(""))
    out["site_packages"] = site
    out["dist_info"] = str(getattr(dist, "_path", "")) or None
    cache_file = os.path.join(CACHE_DIR, "sglang-record-%s.json" % hashlib.sha256(
        (out["dist_info"] or site).encode()).hexdigest()[:16])
    try:
        with open(cache_file) as fh:
            cache = json.load(fh)
    except (OSError, ValueError):
        cache = {}
    fresh = {}
    for f in dist.files or []:
        if f.hash is None or f.hash.mode != "sha256":
            continue
        rel = str(f)
        path = os.path.join(site, rel)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            out["missing"].append(rel)
            continue
        except OSError:
            out["drift"].append(rel)
            continue
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, f.hash.value]
        hit = cache.get(rel)
        if hit is not None and hit[:5] == key:
            ok = hit[5]
        else:
            h = hashlib.sha256()
            try:
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
            except OSError:
                out["drift"].append(rel)
                continue
            out["files_hashed"] += 1
            ok = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode() == f.hash.value
        fresh[rel] = key + [ok]
        out["files_checked"] += 1
        if not ok:
            out["drift"].append(rel)
    if fresh != cache:
        try:
            os.makedirs(CACHE_DIR, exist_ok=True)
            tmp = "%s.%d.tmp" % (cache_file, os.getpid())
            with open(tmp, "w") as fh:
                json.dump(fresh, fh)
            os.replace(tmp, cache_file)
        except OSError:
            pass
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
    files_hashed: int = 0                               # how many were read (the rest: cache hits)
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
        files_checked=int(data.get("files_checked", 0)), files_hashed=int(data.get("files_hashed", 0)),
        error=data.get("error"))


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

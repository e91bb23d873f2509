"""The sglang install behind a host's python: version, where it lives, and whether its files are
still byte-identical to what pip recorded (dist-info RECORD: `path,sha256=<urlsafe b64>,size`).

Drift is what a patch set must refuse: someone edited site-packages by hand.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from fleetspec.model import hostjson
from fleetspec.remote.files import KEEP_CACHE, python_c

# Runs in the host's python (3.8+), standard library only; prints one JSON object.
# Hashing every file of sglang costs seconds of host CPU, so verdicts are cached on the host by
# each file's (size, mtime_ns, ctime_ns, inode), as git's index does: any write changes ctime, which
# no user can set back, so a cached verdict is only reused for a file nobody has written since.
# `status` runs this on every host at once, so the common case (nothing written since the last
# check) must be cheap: the dist-info is found and RECORD read without importlib.metadata (which
# builds a PackagePath per file: 0.2 s of CPU for sglang's 5,800 files), and one digest over every
# file's stat key is compared with the last run's before the per-file cache is even read.
SNIPPET = r'''
import base64, csv, hashlib, json, os, sys
CACHE_DIR = os.environ.get("FLEETSPEC_FACT_CACHE", "/var/cache/fleetspec")
out = {"python": sys.executable, "python_version": sys.version.split()[0], "version": None,
       "site_packages": None, "dist_info": None, "drift": [], "missing": [], "files_checked": 0,
       "files_hashed": 0}

def find_dist():
    for entry in sys.path:
        folder = entry or "."
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info") and name.split("-")[0].lower().replace(".", "_") == "sglang":
                info = os.path.join(folder, name)
                version = None
                try:
                    with open(os.path.join(info, "METADATA"), encoding="utf-8") as fh:
                        for line in fh:
                            if line.startswith("Version:"):
                                version = line.split(":", 1)[1].strip()
                                break
                            if not line.strip():
                                break
                    with open(os.path.join(info, "RECORD"), "rb") as fh:
                        record = fh.read()
                except OSError:
                    continue
                if version:
                    return os.path.abspath(folder), os.path.abspath(info), version, record
    return None

def save(path, value):
    if os.environ.get("FLEETSPEC_FACT_CACHE_KEEP") != "1":
        return
    try:
        os.makedirs(CACHE_DIR, exist_ok=True)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w") as fh:
            json.dump(value, fh)
        os.replace(tmp, path)
    except OSError:
        pass

def load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None

found = find_dist()
if found is None:
    out["error"] = "sglang not installed: no sglang-*.dist-info on sys.path of %s" % (sys.executable,)
else:
    site, info, out["version"], record = found
    out["site_packages"], out["dist_info"] = site, info
    rows = []
    for row in csv.reader(record.decode("utf-8").splitlines()):
        if len(row) >= 2 and row[1].startswith("sha256="):
            rows.append((row[0], row[1][7:]))
    keys, unsure = [], False
    site_fd = os.open(site, os.O_RDONLY)
    for rel, _ in rows:
        try:
            st = os.stat(rel, dir_fd=site_fd)
        except FileNotFoundError:
            keys.append(None)
            continue
        except OSError:
            keys.append(False)
            unsure = True
            continue
        keys.append([st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
    os.close(site_fd)
    stem = os.path.join(CACHE_DIR, "sglang-record-%s" % hashlib.sha256(info.encode()).hexdigest()[:16])
    digest = hashlib.sha256(record + repr(keys).encode()).hexdigest()
    summary = None if unsure else load(stem + ".summary.json")
    if isinstance(summary, dict) and summary.get("digest") == digest:
        for k in ("drift", "missing", "files_checked"):
            out[k] = summary[k]
    else:
        cache = load(stem + ".json") or {}
        fresh = {}
        for (rel, value), key in zip(rows, keys):
            if key is None:
                out["missing"].append(rel)
                continue
            if key is False:
                out["drift"].append(rel)
                continue
            hit = cache.get(rel)
            if isinstance(hit, list) and hit[:5] == key + [value]:
                ok = hit[5]
            else:
                h = hashlib.sha256()
                try:
                    with open(os.path.join(site, rel), "rb") as fh:
                        for chunk in iter(lambda: fh.read(1 << 20), b""):
                            h.update(chunk)
                except OSError:
                    out["drift"].append(rel)
                    continue
                out["files_hashed"] += 1
                ok = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode() == value
            fresh[rel] = key + [value, ok]
            out["files_checked"] += 1
            if not ok:
                out["drift"].append(rel)
        if fresh != cache:
            save(stem + ".json", fresh)
        if not unsure:
            save(stem + ".summary.json", {"digest": digest, "drift": out["drift"], "missing": out["missing"],
                                          "files_checked": out["files_checked"]})
if out["site_packages"] and len(sys.argv) > 1:
    out["hashes"] = {}
    for rel in sys.argv[1:]:
        h = hashlib.sha256()
        try:
            with open(os.path.join(out["site_packages"], rel), "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            out["hashes"][rel] = h.hexdigest()
        except OSError:
            out["hashes"][rel] = None
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
    hashes: dict[str, str | None] | None = None          # hash_paths' sha256 (None: absent); None: not asked

    @property
    def installed(self) -> bool:
        return self.version is not None

    @property
    def pristine(self) -> bool:
        return self.installed and not self.drift and not self.missing


def command(python: str, hash_paths: tuple[str, ...] = (), keep: bool = False) -> str:
    """`hash_paths`: paths under site-packages to hash too (preflight's patch-set candidates, read
    in the same batch although which sglang version, and so which patch set, is not known yet).
    `keep`: write the caches (a deploy's preflight); status and --plan only read them."""
    return python_c(python, SNIPPET, args=hash_paths, env=KEEP_CACHE if keep else None, keep=keep)


def parse(stdout: str, python: str = "", hash_paths: tuple[str, ...] = (), keep: bool = False) -> SglangInstall:
    data = hostjson.loads_object(stdout.strip().splitlines()[-1], "the sglang fact")
    return SglangInstall(
        python=data["python"], python_version=data["python_version"], version=data.get("version"),
        site_packages=data.get("site_packages"), dist_info=data.get("dist_info"),
        drift=sorted(data.get("drift", [])), missing=sorted(data.get("missing", [])),
        files_checked=int(data.get("files_checked", 0)), files_hashed=int(data.get("files_hashed", 0)),
        error=data.get("error"), hashes=data.get("hashes") if hash_paths else None)


def record_hash(data: bytes) -> str:
    """The RECORD form of a file's sha256 (urlsafe base64, no padding)."""
    import hashlib

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

"""The host's torch: version, CUDA, C++ ABI and python tag — what a compiled kernel must match."""

from __future__ import annotations

from dataclasses import dataclass

from fleetspec.model import hostjson
from fleetspec.remote.files import KEEP_CACHE, python_c

# Importing torch costs seconds of host CPU on every preflight, so the build facts (version, CUDA
# build, C++ ABI, arch list) are cached on the host, keyed by the stat of torch's version.py and
# its _C extension: reinstalling or upgrading torch rewrites them, and changes the key.
SNIPPET = r'''
import glob, hashlib, importlib.util, json, os, sys
out = {"python_tag": "cp%d%d" % sys.version_info[:2], "version": None, "cuda": None, "cxx11_abi": None}
CACHE_DIR = os.environ.get("FLEETSPEC_FACT_CACHE", "/var/cache/fleetspec")
key, cache_file = None, None
try:
    spec = importlib.util.find_spec("torch")
    root = os.path.dirname(spec.origin) if spec and spec.origin else None
    if root:
        parts = [sys.executable]
        for f in [os.path.join(root, "version.py")] + sorted(glob.glob(os.path.join(root, "_C*.so"))):
            st = os.stat(f)
            parts.append("%s:%d:%d:%d:%d" % (f, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        key = "|".join(parts)
        cache_file = os.path.join(CACHE_DIR, "torch-%s.json" % hashlib.sha256(sys.executable.encode()).hexdigest()[:16])
        with open(cache_file) as fh:
            cached = json.load(fh)
        if cached.get("key") == key:
            print(json.dumps(dict(cached["facts"], cached=True)))
            sys.exit(0)
except (OSError, ValueError):
    pass
try:
    import torch
    out["version"] = torch.__version__
    out["cuda"] = getattr(torch.version, "cuda", None)
    out["cxx11_abi"] = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False))
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["arch_list"] = torch.cuda.get_arch_list() if out["cuda_available"] else []
    except Exception:
        out["cuda_available"] = False
    if key and cache_file and os.environ.get("FLEETSPEC_FACT_CACHE_KEEP") == "1":
        try:
            os.makedirs(CACHE_DIR, exist_ok=True)
            tmp = "%s.%d.tmp" % (cache_file, os.getpid())
            with open(tmp, "w") as fh:
                json.dump({"key": key, "facts": out}, fh)
            os.replace(tmp, cache_file)
        except OSError:
            pass
except Exception as err:
    out["error"] = "%s: %s" % (type(err).__name__, err)
print(json.dumps(out))
'''


@dataclass(frozen=True)
class TorchInfo:
    python_tag: str
    version: str | None
    cuda: str | None
    cxx11_abi: bool | None
    cuda_available: bool = False
    arch_list: tuple[str, ...] = ()
    error: str | None = None

    @property
    def installed(self) -> bool:
        return self.version is not None


def command(python: str, keep: bool = False) -> str:
    """`keep`: write the cache (a deploy's preflight); status and --plan only read it."""
    return python_c(python, SNIPPET, env=KEEP_CACHE if keep else None, keep=keep)   # never from the login folder


def parse(stdout: str, python: str = "", keep: bool = False) -> TorchInfo:
    d = hostjson.loads_object(stdout.strip().splitlines()[-1], "the torch fact")
    return TorchInfo(python_tag=d["python_tag"], version=d.get("version"), cuda=d.get("cuda"),
                     cxx11_abi=d.get("cxx11_abi"), cuda_available=bool(d.get("cuda_available")),
                     arch_list=tuple(d.get("arch_list") or ()), error=d.get("error"))

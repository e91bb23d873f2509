"""The SGLang environments the lab hosts (and the tests) run: real sglang wheels, CPU torch,
and only the small packages each version's argument parser needs.

Wheels are downloaded once into /var/cache/fleetspec/wheels; environments are built offline from
there, so a container without a network can be populated and a warm machine builds nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fleetspec.model.cache import cache_dir

CACHE = cache_dir()
WHEELS = CACHE / "wheels"
ENVS = CACHE / "envs"

TORCH = "torch==2.13.0"
# Where this kind of machine keeps the CPU torch wheel (pip's find-links).
LOCAL_WHEEL_DIRS = ("/opt/wheels",)
SGLANG_VERSIONS = ("0.5.13.post1", "0.5.23")

# Exact pins, so every machine builds the same environments from the same cached wheels.
# What ServerArgs needs to import and parse on a CPU box (facts in shared/LAB.md), all --no-deps.
PARSER_DEPS = [
    "numpy==2.4.6", "orjson==3.13.0", "psutil==7.2.2", "pybase64==1.5.1", "requests==2.34.2",
    "urllib3==2.8.0", "idna==3.20", "certifi==2026.10.19.post1", "charset-normalizer==3.5.3",
    "packaging==26.4", "pillow==13.0.0", "starlette==1.10.0", "anyio==4.16.0", "sniffio==1.3.1",
    "msgspec==0.23.0", "pydantic==2.14.4", "pydantic-core==2.50.5", "typing-inspection==0.4.5",
    "annotated-types==0.8.0", "pyzmq==27.3.0", "tqdm==4.70.1", "ipython==9.18.1",
    "traitlets==5.16.1", "pygments==2.21.0", "aiohttp==3.14.5", "multidict==7.2.1",
    "attrs==26.1.0", "yarl==1.25.1", "propcache==0.5.4", "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0", "frozenlist==1.8.0", "typing_extensions==4.16.0", "openai==2.6.1", "distro==1.9.0", "jiter==0.19.0",
    "partial_json_parser==0.2.1.1.post7", "dill==0.4.1", "sentencepiece==0.2.3", "einops==0.8.2",
    "compressed_tensors==0.20.1", "gguf==0.19.0", "setproctitle==1.3.8", "pyyaml==6.0.4",
    "filelock==4.3.1", "fsspec==2026.9.0", "jinja2==3.1.6", "markupsafe==3.0.4", "sympy==1.14.0",
    "mpmath==1.4.1", "networkx==3.6.1", "triton==3.9.0", "httpx==0.28.1", "httpcore==1.0.9",
    "h11==0.16.0",
]
# 0.5.13.post1 also imports transformers (with its own deps). Both get the real triton wheel:
# 0.5.13.post1's `fla` code inspects triton.autotune's signature, so a stub would break it.
TRANSFORMERS = ["transformers==5.8.1", "huggingface-hub==1.33.0", "tokenizers==0.22.2",
                "safetensors==0.8.0", "regex==2026.11.19", "hf-xet==1.8.0", "typer==0.29.2",
                "shellingham==1.5.4", "rich==15.0.0", "markdown-it-py==4.3.0", "mdurl==0.1.2",
                "click==8.5.1", "annotated-doc==0.0.7"]
EXTRA = {
    "0.5.13.post1": TRANSFORMERS,
    "0.5.23": [],
}


# What the speculative workers import beyond the parser (pure Python): the lab's stand-in engine
# imports the algorithm's real worker class at start and fails on anything missing that is not a
# GPU-only extension (fleetspec_lab_engine.args.GPU_ONLY). Found by importing dflash_worker,
# eagle_worker_v2 and the DDTree workers in each env until they imported.
WORKER_DEPS = {
    "0.5.13.post1": ["loguru==0.7.3", "uvicorn==0.54.0", "fastapi==0.165.0", "opentelemetry-api==1.45.2"],
    # 0.5.23's DFlash worker imports transformers (the parser does not) and sglang.kernels, which
    # imports tvm_ffi at module level (a CPU-installable wheel; sglang pins this version).
    "0.5.23": ["loguru==0.7.3", "uvicorn==0.54.0", "fastapi==0.165.0", "opentelemetry-api==1.45.2",
               *TRANSFORMERS, "apache-tvm-ffi==0.1.11"],
}


def requirements(version: str) -> list[str]:
    if version not in SGLANG_VERSIONS:
        raise ValueError(f"unknown sglang version {version!r}; known: {', '.join(SGLANG_VERSIONS)}")
    return [f"sglang=={version}", TORCH, *PARSER_DEPS, *EXTRA[version], *WORKER_DEPS[version]]


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def cached_wheel(requirement: str) -> Path | None:
    name, _, version = requirement.partition("==")
    for wheel in WHEELS.glob("*.whl"):
        w_name, w_version = wheel.name.split("-")[:2]
        if _normal(w_name) == _normal(name) and w_version.split("+")[0] == version:  # PEP 440: == ignores +cpu
            return wheel
    return None


class DownloadFailed(Exception):
    """The package index could not give a wheel: one line names what was asked for."""


def download_commands(versions=SGLANG_VERSIONS, python: str = sys.executable) -> list[list[str]]:
    """One `pip download` per sglang version for the wheels the cache lacks.

    pip refuses two versions of one project in one call, so each call holds one version's set
    (torch included: the layer builds install offline from this cache and nowhere else).
    """
    commands, asked = [], set()
    for version in versions:
        missing = [r for r in requirements(version) if r not in asked and cached_wheel(r) is None]
        asked.update(missing)
        if missing:
            commands.append([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                             "--disable-pip-version-check", "-d", str(WHEELS),
                             *[f"--find-links={d}" for d in LOCAL_WHEEL_DIRS if Path(d).is_dir()], *missing])
    return commands


def download_wheels(versions=SGLANG_VERSIONS, python: str = sys.executable) -> int:
    """Fill the wheel cache (needs the package index only for wheels not cached yet).

    Returns how many pip calls it made (0 on a warm cache); raises DownloadFailed with one line.
    """
    WHEELS.mkdir(parents=True, exist_ok=True)
    commands = download_commands(versions, python)
    for command in commands:
        wanted = [a for a in command if "==" in a]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            last = next((ln for ln in reversed(done.stderr.splitlines()) if ln.strip()), "no output")
            raise DownloadFailed(
                f"pip download of {len(wanted)} wheel(s) ({', '.join(wanted[:3])}{', ...' if len(wanted) > 3 else ''}) "
                f"into {WHEELS} failed (exit {done.returncode}): {last.strip()}")
    return len(commands)


def missing_wheels(version: str) -> list[str]:
    """The requirements of `version` that the wheel cache cannot satisfy offline."""
    return [r for r in requirements(version) if cached_wheel(r) is None]


def recipe_hash(version: str) -> str:
    import hashlib

    text = "\n".join([version, *requirements(version), *sorted(TORCHVISION_STUB.values())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pip_install_offline(python: str, version: str, *, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The pip command that installs one version's environment from the wheel cache alone."""
    return [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--find-links", str(WHEELS), *extra_args, *requirements(version)]


def local_env(version: str) -> Path:
    """A venv on this machine with `version` of sglang, built once from the wheel cache.

    Used by tests that run the real parser of each version; returns the venv's python.
    """
    local_env_built(version)
    return local_env_dir(version) / "bin" / "python"


def local_env_dir(version: str) -> Path:
    """Keyed by the recipe, so a changed pin builds beside the old env instead of over it."""
    return ENVS / f"sglang-{version}-{recipe_hash(version)}"


def local_env_built(version: str) -> bool:
    """Build the local venv of `version` if missing; True when it was built now."""
    env = local_env_dir(version)
    python = env / "bin" / "python"
    marker = env / ".complete"
    if marker.exists() and marker.read_text().strip() == recipe_hash(version):
        return False
    download_wheels((version,))
    require_cached(version)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
    subprocess.run(pip_install_offline(str(python), version), check=True)
    torchvision_stub(env)
    marker.write_text(recipe_hash(version) + "\n")
    return True


def require_cached(version: str) -> None:
    missing = missing_wheels(version)
    if missing:
        raise DownloadFailed(f"the wheel cache {WHEELS} lacks {', '.join(missing)} for sglang {version}; "
                             f"run: python3 -m fleetspec.lab.prepare")


def site_packages(env: Path) -> Path:
    return next((env / "lib").glob("python3.*/site-packages"))


def torchvision_stub(env: Path) -> None:
    """PyPI's torchvision needs CUDA torch; sglang only imports it, so a stub module suffices."""
    write_torchvision_stub(site_packages(env))


def write_torchvision_stub(site: Path) -> None:
    stub = site / "torchvision"
    stub.mkdir(exist_ok=True)
    for name, text in TORCHVISION_STUB.items():
        (stub / name).parent.mkdir(parents=True, exist_ok=True)
        (stub / name).write_text(text)


# sglang and transformers import many names from torchvision at module level; each submodule of
# the stub answers any attribute with a placeholder that raises only when used.
TORCHVISION_STUB = {
    "__init__.py": '''"""Stub torchvision: sglang imports it, these hosts serve no vision models.

Every `torchvision.*` submodule exists and every attribute is a placeholder that raises when used.
"""
import enum
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stub"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"torchvision is a stub on this host: {self._name} is unavailable")

    def __getattr__(self, item):
        return _Placeholder(f"{self._name}.{item}")

    def __mro_entries__(self, bases):
        return (object,)


def _module_getattr(module_name):
    def __getattr__(item):
        if item == "InterpolationMode":
            return InterpolationMode
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{module_name}.{item}")
    return __getattr__


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_StubFinder())
__getattr__ = _module_getattr(__name__)
''',
}

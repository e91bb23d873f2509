"""The SGLang environments the lab hosts (and the tests) run: real sglang wheels, CPU torch,
and only the small packages each version's argument parser needs.

Wheels are downloaded once into /var/cache/fleetspec/wheels; environments are built offline from
there, so a container without a network can be populated and a warm machine builds nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("FLEETSPEC_CACHE", "/var/cache/fleetspec"))
WHEELS = CACHE / "wheels"
ENVS = CACHE / "envs"

TORCH = "torch==2.13.0"
SGLANG_VERSIONS = ("0.5.13.post1", "0.5.23")

# What ServerArgs needs to import and parse on a CPU box (facts in shared/LAB.md), all --no-deps.
PARSER_DEPS = [
    "numpy", "orjson", "psutil", "pybase64", "requests", "urllib3", "idna", "certifi",
    "charset-normalizer", "packaging", "pillow", "starlette", "anyio", "sniffio", "msgspec",
    "pydantic", "pydantic-core", "typing-inspection", "annotated-types", "pyzmq", "tqdm",
    "ipython", "traitlets", "pygments", "aiohttp", "multidict", "attrs", "yarl", "propcache",
    "aiohappyeyeballs", "aiosignal", "frozenlist", "typing_extensions", "openai",
    "partial_json_parser", "dill", "sentencepiece", "einops", "compressed_tensors", "gguf",
    "setproctitle", "pyyaml", "filelock", "fsspec", "jinja2", "markupsafe", "sympy", "mpmath",
    "networkx", "triton",
]
# 0.5.13.post1 also imports transformers (with its own deps). Both get the real triton wheel:
# 0.5.13.post1's `fla` code inspects triton.autotune's signature, so a stub would break it.
EXTRA = {
    "0.5.13.post1": ["transformers==5.8.1", "huggingface-hub", "tokenizers",
                     "safetensors", "regex", "hf-xet", "typer", "shellingham", "rich",
                     "markdown-it-py", "mdurl", "httpx", "httpcore", "h11", "click"],
    "0.5.23": [],
}


def requirements(version: str) -> list[str]:
    if version not in SGLANG_VERSIONS:
        raise ValueError(f"unknown sglang version {version!r}; known: {', '.join(SGLANG_VERSIONS)}")
    return [f"sglang=={version}", TORCH, *PARSER_DEPS, *EXTRA[version]]


def download_wheels(versions=SGLANG_VERSIONS, python: str = sys.executable) -> None:
    """Fill the wheel cache (needs the package index; a no-op when every wheel is there)."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    reqs = sorted({r for v in versions for r in requirements(v)})
    subprocess.run(
        [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "-d", str(WHEELS), *reqs],
        check=True,
    )


def pip_install_offline(python: str, version: str, *, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The pip command that installs one version's environment from the wheel cache alone."""
    return [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--find-links", str(WHEELS), *extra_args, *requirements(version)]


def local_env(version: str) -> Path:
    """A venv on this machine with `version` of sglang, built once from the wheel cache.

    Used by tests that run the real parser of each version; returns the venv's python.
    """
    env = ENVS / f"sglang-{version}"
    python = env / "bin" / "python"
    marker = env / ".complete"
    if marker.exists():
        return python
    download_wheels((version,))
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
    subprocess.run(pip_install_offline(str(python), version), check=True)
    torchvision_stub(env)
    marker.write_text(version + "\n")
    return python


def site_packages(env: Path) -> Path:
    return next((env / "lib").glob("python3.*/site-packages"))


def torchvision_stub(env: Path) -> None:
    """PyPI's torchvision needs CUDA torch; sglang only imports it, so a stub module suffices."""
    stub = site_packages(env) / "torchvision"
    stub.mkdir(exist_ok=True)
    (stub / "__init__.py").write_text('"""Stub: sglang imports torchvision; the lab has no vision models."""\n__version__ = "0.0.0+stub"\n')

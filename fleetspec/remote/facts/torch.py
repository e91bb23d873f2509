"""The host's torch: version, CUDA, C++ ABI and python tag — what a compiled kernel must match."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

SNIPPET = r'''
import json, sys
out = {"python_tag": "cp%d%d" % sys.version_info[:2], "version": None, "cuda": None, "cxx11_abi": None}
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


def command(python: str) -> str:
    return f"{shlex.quote(python)} -c {shlex.quote(SNIPPET)}"


def parse(stdout: str, python: str = "") -> TorchInfo:
    d = json.loads(stdout.strip().splitlines()[-1])
    return TorchInfo(python_tag=d["python_tag"], version=d.get("version"), cuda=d.get("cuda"),
                     cxx11_abi=d.get("cxx11_abi"), cuda_available=bool(d.get("cuda_available")),
                     arch_list=tuple(d.get("arch_list") or ()), error=d.get("error"))

"""Parsing and resolution with the host's real sglang: its parser, its SpeculativeAlgorithm, its
worker dispatch. Whatever the installed (or overlaid) sglang would refuse at start, this refuses too.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import logging
from dataclasses import dataclass, field

log = logging.getLogger("fleetspec_lab_engine")

DDTREE_REQUIRED = "sglang.srt.speculative.ddtree_utils"
DDTREE_FLAGS = ("speculative_ddtree_budget", "speculative_ddtree_topk_cap", "speculative_ddtree_shadow_linear")
# Top-level packages that exist only as CUDA builds (or need a GPU to import): a worker import that
# fails for lack of one of these is logged and tolerated; any other import failure fails the start.
GPU_ONLY = frozenset({"sgl_kernel", "flashinfer", "flash_attn", "deep_gemm", "cuda", "cutlass",
                      "vllm", "xformers", "flash_mla", "triton_kernels"})


@dataclass
class Parsed:
    version: str
    argv: list[str]
    values: dict                       # resolved server args (JSON-able)
    algorithm: str                     # resolved name, e.g. EAGLE for NEXTN
    imported: list[str] = field(default_factory=list)
    args: object = None                # the ServerArgs (0.5.23) or argparse namespace (0.5.13.post1)

    def get(self, name, default=None):
        value = self.values.get(name)
        return default if value is None else value


def sglang_version() -> str:
    import sglang

    return getattr(sglang, "__version__", None) or importlib.import_module("sglang.version").__version__


def load_plugins() -> None:
    """0.5.23 (and 0.5.13.post1) load entry-point plugins in the launcher; a plugin may register
    an algorithm, so this comes before parsing."""
    try:
        plugins = importlib.import_module("sglang.srt.plugins")
    except ModuleNotFoundError:
        return
    if hasattr(plugins, "load_plugins"):
        plugins.load_plugins()


def parse(argv: list[str]) -> Parsed:
    version = sglang_version()
    from sglang.srt import server_args as sa

    try:
        # 0.5.23: parses and resolves without a GPU.
        args = sa.prepare_server_args(argv)
        values = _as_dict(args)
        raw = args
    except SystemExit:
        raise
    except Exception as err:  # 0.5.13.post1: __post_init__ runs CUDA-only checks on CPU
        log.info("prepare_server_args stopped at a device check on CPU (%s); using the parsed args", err)
        parser = argparse.ArgumentParser(prog="sglang.launch_server")
        sa.ServerArgs.add_cli_args(parser)
        raw = parser.parse_args(argv)  # unknown flag: exit 2, as the real server does
        try:
            values = _as_dict(sa.ServerArgs.from_cli_args(raw))
        except Exception:
            values = {k: _jsonable(v) for k, v in vars(raw).items()}
    for name in DDTREE_FLAGS:   # 0.5.23's plugin keeps them as plain attributes, off resolved_dict
        if values.get(name) is None and getattr(raw, name, None) is not None:
            values[name] = _jsonable(getattr(raw, name))
    algorithm = resolve_algorithm(values.get("speculative_algorithm"))
    values["speculative_algorithm"] = None if algorithm == "NONE" else algorithm
    return Parsed(version=version, argv=list(argv), values=values, algorithm=algorithm, args=raw)


def resolve_algorithm(name) -> str:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if name is None:
        return "NONE"
    try:
        algo = SpeculativeAlgorithm.from_string(name)
    except ValueError:
        if str(name).upper() != "NEXTN":
            raise
        algo = SpeculativeAlgorithm.from_string("EAGLE")  # ServerArgs applies NEXTN -> EAGLE
    return str(getattr(algo, "name", algo)).upper()


def worker_class(parsed: Parsed):
    """The worker class the real dispatch (`SpeculativeAlgorithm...create_worker`) picks.

    Importing it imports the worker's modules, as a real scheduler does at start. A module missing
    from GPU_ONLY is tolerated (None, logged); any other failure (a missing pure-Python package, a
    broken patch, the dispatch refusing the arguments) propagates and fails the start.
    """
    if parsed.algorithm == "NONE":
        return None
    if parsed.algorithm == "DDTREE":
        importlib.import_module(DDTREE_REQUIRED)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string(parsed.algorithm)
    try:
        return algo.create_worker(dispatch_args(parsed))
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top not in GPU_ONLY:
            raise
        log.info("worker for %s: not imported, needs %s (GPU-only, allow-listed)", parsed.algorithm, err.name)
        return None


def dispatch_args(parsed: Parsed):
    """What create_worker reads. On CPU neither version runs the speculative handlers: 0.5.13.post1
    stops at a CUDA check, 0.5.23's prepare_server_args leaves them to resolution on the device.
    So what DFlash's handler (and DDTREE's, which mirrors it) settles is added here, and only
    that: DFlash and DDTREE run without overlap scheduling (disable_overlap_schedule = True)."""
    args = parsed.args
    family = parsed.algorithm in ("DFLASH", "DDTREE")
    if args is not None and hasattr(args, "resolved_dict"):
        if not family:
            return args
        import copy

        args = copy.copy(args)        # 0.5.23: a declaration, read through resolving_view
        declared = list(getattr(args, "_resolved_overrides", None) or ())
        declared.append(("fleetspec_lab_engine: the DFlash handler (runs on the device)",
                         {"disable_overlap_schedule": True}))
        try:
            args._resolved_overrides = declared
        except (AttributeError, TypeError):
            args.disable_overlap_schedule = True
        return args
    import types

    ns = types.SimpleNamespace(**{**vars(args or types.SimpleNamespace()), **parsed.values})
    if family:
        ns.disable_overlap_schedule = True
    return ns


def _as_dict(args) -> dict:
    if hasattr(args, "resolved_dict"):
        try:
            return {k: _jsonable(v) for k, v in args.resolved_dict().items()}
        except Exception:
            pass
    if dataclasses.is_dataclass(args):
        return {f.name: _jsonable(getattr(args, f.name, None)) for f in dataclasses.fields(args)}
    return {k: _jsonable(v) for k, v in vars(args).items() if not k.startswith("_")}


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)

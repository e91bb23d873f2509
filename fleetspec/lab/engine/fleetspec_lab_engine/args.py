"""Parsing and resolution with the host's real sglang: its parser, its SpeculativeAlgorithm, its
modules. Whatever the installed (or overlaid) sglang would refuse at start, this refuses too.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import logging
from dataclasses import dataclass, field

log = logging.getLogger("fleetspec_lab_engine")

# Modules a real server imports for each algorithm (whichever of them this version has).
ALGO_MODULES = {
    "DFLASH": ["sglang.srt.speculative.dflash_info", "sglang.srt.speculative.dflash_utils",
               "sglang.srt.speculative.dflash_worker", "sglang.srt.speculative.dflash_worker_v2"],
    "EAGLE": ["sglang.srt.speculative.eagle_info", "sglang.srt.speculative.eagle_worker",
              "sglang.srt.speculative.eagle_worker_v2"],
    "EAGLE3": ["sglang.srt.speculative.eagle_info", "sglang.srt.speculative.eagle_worker"],
    "STANDALONE": ["sglang.srt.speculative.standalone_worker"],
    "NGRAM": ["sglang.srt.speculative.ngram_worker"],
}
DDTREE_REQUIRED = "sglang.srt.speculative.ddtree_utils"


@dataclass
class Parsed:
    version: str
    argv: list[str]
    values: dict                       # resolved server args (JSON-able)
    algorithm: str                     # resolved name, e.g. EAGLE for NEXTN
    imported: list[str] = field(default_factory=list)

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
    algorithm = resolve_algorithm(values.get("speculative_algorithm"))
    values["speculative_algorithm"] = None if algorithm == "NONE" else algorithm
    return Parsed(version=version, argv=list(argv), values=values, algorithm=algorithm)


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


def import_algorithm_modules(algorithm: str) -> list[str]:
    """Import what the algorithm needs. Modules missing from this version are skipped; a module
    that exists but fails to import fails the start, unless all it lacks is a GPU-only package."""
    names = list(ALGO_MODULES.get(algorithm, []))
    if algorithm == "DDTREE":
        if importlib.util.find_spec(DDTREE_REQUIRED) is None:
            raise RuntimeError(f"DDTREE needs {DDTREE_REQUIRED}, which this sglang does not have")
        spec_pkg = importlib.import_module("sglang.srt.speculative")
        extra = set()
        for folder in getattr(spec_pkg, "__path__", []):
            from pathlib import Path

            extra.update(f"sglang.srt.speculative.{p.stem}" for p in Path(folder).glob("ddtree*.py"))
        names = [DDTREE_REQUIRED, *sorted(extra - {DDTREE_REQUIRED}), *ALGO_MODULES["DFLASH"]]
    done = []
    for name in names:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            top = (err.name or "").split(".")[0]
            if name == DDTREE_REQUIRED or top in ("sglang", ""):
                raise
            log.info("import %s: skipped, needs %s (a GPU-only package the lab lacks)", name, err.name)
            continue
        done.append(name)
    return done


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

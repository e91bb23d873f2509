"""kernels build, list: compile the playbooks' torch extensions and show what is cached."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from fleetspec.build import kernel as KB
from fleetspec.cli.output import echo, echo_table
from fleetspec.errors import UserError
from fleetspec.model import kernel as K


def _sources(ctx, given: tuple[Path, ...]) -> list[Path]:
    if given:
        return list(given)
    root = ctx.obj.root_path if ctx.obj is not None else Path.cwd()
    found = sorted(p.parent for p in (Path(root) / "playbooks").glob("*/kernels/*/kernel.json"))
    if not found:
        raise UserError(f"no kernel folders (playbooks/*/kernels/*/kernel.json) under {root}")
    return found


@click.group("kernels")
def kernels_group():
    """Compiled kernels: torch C++/CUDA extensions with their ABI tags."""


@kernels_group.command("build")
@click.argument("sources", nargs=-1, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also copy the built library and its kernel.json here.")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=K.KERNEL_CACHE,
              show_default=True, help="Build cache, keyed by source hash and torch version.")
@click.option("--verbose", is_flag=True, help="Show the compiler's output.")
@click.option("--cuda/--cpu", "cuda", default=None,
              help="CUDA build (refused when this python's torch or nvcc cannot) or CPU only; "
                   "default: CUDA where a GPU is visible.")
@click.option("--arch", default=None, metavar="LIST",
              help="GPU compute capabilities to build for, e.g. '9.0;10.0' (the hosts' nvidia-smi "
                   "compute_cap); needed for --cuda without a GPU here.")
@click.option("--torch-root", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="An unpacked CUDA build of torch to build against instead of this python's torch "
                   "(scripts/cuda-toolchain.sh fetches one); with --cuda, --arch and --cuda-home.")
@click.option("--cuda-home", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="A CUDA toolkit with bin/nvcc (with --torch-root).")
@click.option("--on", "on_host", default=None, metavar="HOST",
              help="Build on this inventory host with its python, torch and compiler (CUDA when its torch "
                   "is a CUDA build: arch from its nvidia-smi, or --arch) and fetch the library into --cache.")
@click.pass_context
def build(ctx, sources, out, cache, verbose, cuda, arch, torch_root, cuda_home, on_host):
    """Build each kernel folder (default: every one in the playbooks) with this machine's torch, on a
    fleet host (--on), or for CUDA hosts against an unpacked CUDA torch (--torch-root) without a GPU here."""
    folders = _sources(ctx, sources)
    if out is not None and len(folders) > 1:
        raise UserError("--out takes one kernel folder at a time")
    if (torch_root is None) != (cuda_home is None) or (torch_root is not None and (cuda is not True or not arch)):
        raise UserError("--torch-root and --cuda-home go together, with --cuda and --arch")
    if on_host is not None and (torch_root is not None or out is not None):
        raise UserError("--on builds on the host: not with --torch-root, --cuda-home or --out")
    host = ctx.obj.select_one(on_host, "kernels build --on") if on_host is not None else None
    for folder in folders:
        if host is not None:
            from fleetspec.build.kernel_on_host import build_on_host

            kernel, built = build_on_host(ctx.obj.transport(host), host, folder, cache, cuda=cuda, arch=arch)
        elif torch_root is not None:
            kernel, built = KB.build_kernel_offline(folder, torch_root, cuda_home, arch, cache, verbose)
            if out is not None:
                Path(out).mkdir(parents=True, exist_ok=True)
                for name in (kernel.library_file, K.KERNEL_JSON, *kernel.spec.sources, *kernel.spec.cuda_sources):
                    shutil.copyfile(kernel.spec.root / name, Path(out) / name)
        else:
            kernel, built = KB.build_kernel(folder, cache, out, verbose, cuda=cuda, arch=arch)
        abi = kernel.abi
        where = f" on {host.name}" if host is not None else ""
        echo(f"{kernel.name}: {'built' if built else 'cached'}{where} {kernel.path} "
             f"(torch {abi.torch}, {abi.python_tag}, cuda {abi.cuda}, cxx11_abi {abi.cxx11_abi}, "
             f"{abi.platform}{', arch ' + ';'.join(abi.arch_list) if abi.arch_list else ''}, "
             f"sha256 {kernel.sha256[:12]})")


@kernels_group.command("list")
@click.argument("sources", nargs=-1, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=K.KERNEL_CACHE,
              show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_(ctx, sources, cache, as_json):
    """Cached builds of each kernel folder's current sources."""
    builds = [k for folder in _sources(ctx, sources) for k in K.built_kernels(folder, cache)]
    if as_json:
        echo(json.dumps([{**k.to_json(), "path": str(k.path)} for k in builds], indent=2))
        return
    echo_table(["kernel", "torch", "python", "cuda", "cxx11", "platform", "sha256", "path"],
               [[k.name, k.abi.torch, k.abi.python_tag, k.abi.cuda, str(k.abi.cxx11_abi), k.abi.platform,
                 k.sha256[:12], str(k.path)] for k in builds])


COMMANDS = [kernels_group]

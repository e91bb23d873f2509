"""What preflight found on one host and decided for the deploy: the service, its ExecStart and
the new one, the sglang and torch install, the patch set and kernels chosen. Every later step
reads it; ops/preflight.py makes it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fleetspec.model.baseline import Baseline
from fleetspec.model.container_launch import ContainerRun
from fleetspec.model.inventory import Host
from fleetspec.model.kernel import Kernel
from fleetspec.model.launch import LaunchForm
from fleetspec.model.layout import HostLayout
from fleetspec.model.patchset import PatchSet
from fleetspec.model.playbook import Guard, Playbook
from fleetspec.ops import probes, redaction
from fleetspec.ops.argv import LaunchPlan
from fleetspec.ops.options import ResolvedOptions
from fleetspec.remote.facts.gpu_health import GpuHealth
from fleetspec.remote.facts.sglang import SglangInstall
from fleetspec.remote.facts.systemd import SystemdUnit
from fleetspec.remote.facts.torch import TorchInfo

if TYPE_CHECKING:
    from fleetspec.ops.gates import Measurement


@dataclass
class Preflight:
    host: Host
    root: Path
    playbook: Playbook
    service: str
    python: str
    unit: SystemdUnit
    unit_bytes: bytes
    dropins: dict[str, bytes]                     # admin drop-ins, fleetspec's own excluded
    exec_argv: list[str]
    form: LaunchForm                              # the baseline ExecStart's launch form
    launch: LaunchPlan                            # kept/dropped/carried, env verdicts
    sglang: SglangInstall
    torch: TorchInfo | None
    hybrid: bool
    options: ResolvedOptions
    new_argv: list[str]
    patchset: PatchSet | None
    kernels: list[Kernel]
    notes: list[str] = field(default_factory=list)
    baseline: Baseline | None = None
    keep_releases: int = 3
    guard: Guard | None = None
    before: Measurement | None = None             # the service's figures before the switch (gates)
    staged_ahead: str | None = None               # the newest release `deploy --stage-only` left for this algo
    staged_ahead_older: tuple[str, ...] = ()      # older ones for it (superseded by the next stage or deploy)
    gpu_health: GpuHealth | None = None           # as preflight read it; a failed restart is compared with it
    container: ContainerRun | None = None         # a `docker run`/`podman run` unit (form: the command inside)
    container_facts: dict | None = None           # its runtime, image, image id and digest (the baseline's)

    @property
    def sglang_version(self) -> str:
        """The host's sglang version (preflight.run refuses a host without one)."""
        return self.sglang.version or ""

    @property
    def site_packages(self) -> str:
        return self.sglang.site_packages or ""

    @property
    def layout(self) -> HostLayout:
        return HostLayout(self.service)

    @property
    def staged_ahead_note(self) -> str | None:
        """Said by a deploy and its plan, never a release's own note (a manifest must not change with it)."""
        return (f"{self.host.name}: release {self.staged_ahead} was staged ahead (deploy --stage-only): this deploy "
                "switches to it, taken as it is when it would stage the same release (else restaged)"
                if self.staged_ahead else None)

    @property
    def playbook_algorithm(self) -> str:
        return self.playbook.speculative_algorithm

    @property
    def patchset_name(self) -> str | None:
        return self.patchset.root.name if self.patchset else None

    # What the later steps need -----------------------------------------------------------------
    def patch_files(self) -> dict[str, bytes]:
        if not self.patchset:
            return {}
        return {f.path: self.patchset.source(f).read_bytes() for f in self.patchset.files}

    def kernel_files(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for kernel in self.kernels:
            out.update(kernel.file_bytes())
        return out

    def smoke_scripts(self, kernels_dir: str):
        """(name, python source, parse(stdout, stderr, rc) -> dict) for each smoke test the
        playbook asks for, in the order they run."""
        from fleetspec.remote import smoke_host as smoke

        def parse(stdout, stderr, rc):
            result = smoke.parse_result(stdout)
            data = dict(result.data)
            if not result.ok and not data.get("error"):
                data["error"] = (stderr.strip().splitlines() or [f"exit {rc}"])[-1]
            data["ok"] = result.ok and rc == 0
            return data

        want = self.playbook.smoke
        out = []
        if want.imports:
            out.append(("imports", smoke.imports_script(list(want.imports)), parse))
        if want.parse_args:
            out.append(("parse_args", smoke.parse_args_script(self.parse_slice()), parse))
        required = self.playbook.kernel_policy == "required"
        if want.kernels:   # before ddtree_sample: the payload loads the release's library either way
            for kernel in self.kernels:
                for name in kernel.file_bytes():
                    out.append((f"kernel:{name}", smoke.kernel_script(f"{kernels_dir}/{name}", required), parse))
        if want.ddtree_sample:
            out.append(("ddtree_sample", smoke.ddtree_sample_script(kernel_required=required and bool(self.kernels)),
                        parse))
        return out

    def parse_slice(self) -> list[str]:
        """Exactly what sglang's entry point hands its parser for the new argv (both forms)."""
        from fleetspec.model.launch import parsed_args

        return parsed_args(self.form, self.new_argv, self.sglang_version)

    @property
    def exec_prefix(self) -> str:
        return self.container.prefix if self.container is not None else self.form.prefix

    @property
    def exec_path(self) -> str | None:
        head = self.container if self.container is not None else self.form
        return head.path if "@" in head.prefix else None

    def environment(self, release, folder: str | None = None) -> dict[str, str]:
        """The release's variables; paths under `folder` (a container: the release folder, the one
        it mounts), else under the `current` link."""
        env = dict(self.playbook.launch.env)
        at = folder or str(self.layout.current)
        if release.files and release.mode == "release":
            env["PYTHONPATH"] = f"{at}/overlay"
        if release.kernels:
            env["FLEETSPEC_KERNELS"] = f"{at}/kernels"
        return env

    def probe_spec(self, expected: str | None) -> probes.ProbeSpec:
        return probes.spec_for_host(self.host, expected, self.playbook.probes)

    def secret_values(self) -> dict[str, str]:
        """launch.secret_env: each name's value from fleetspec's own environment (checked by run())."""
        return {name: os.environ[name] for name in self.playbook.launch.secret_env}

    def redact(self, text: str) -> str:
        return redaction.redact(text, self.host, self.playbook, [*self.exec_argv, *self.new_argv])

    def gate_names(self) -> list[str]:
        g = self.playbook.gates
        return [name for name in ("acceptance", "throughput", "parity") if getattr(g, name) is not None]

    def summary(self) -> dict:
        return {"sglang": self.sglang.version, "torch": getattr(self.torch, "version", None),
                "hybrid": self.hybrid, "options": dict(self.options.values), "notes": self.notes,
                "patchset": self.patchset_name, "argv": self.new_argv,
                "launch": self.launch.to_dict(), **({"container": self.container_facts} if self.container_facts else {})}

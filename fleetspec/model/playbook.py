"""Playbooks (`playbooks/<algo>.yaml`): what an algo needs and how to prove it, as typed data.

Everything is validated at load time (types, unknown keys, folders that must exist), so a deploy
never discovers a typo half way through. Rendering flags for a host lives in fleetspec.ops.flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from fleetspec.errors import UserError
from fleetspec.model.bake import BakeSpec, StopSpec, bake_from, stop_from
from fleetspec.model.names import is_name
from fleetspec.model.yamlload import Fields, Kind, describe, load_yaml_file

Scalar = bool | int | float | str


@dataclass(frozen=True)
class HybridRule:
    """How the playbook treats hybrid (linear-attention / recurrent) targets."""

    option: str
    auto: str
    otherwise: str
    refuse: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flag:
    """One group of argv tokens (templates), included when `when` (a jinja expression) holds."""

    tokens: tuple[str, ...]
    when: str | None = None


# Speculative options of the baseline that describe the draft's runtime rather than the algorithm:
# a DFlash-based drafter still needs them (the engine dies at init without them on some models).
DEFAULT_CARRY = ("--speculative-draft-attention-backend", "--speculative-moe-runner-backend",
                 "--speculative-moe-a2a-backend")


@dataclass(frozen=True)
class Launch:
    flags: tuple[Flag, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    secret_env: tuple[str, ...] = ()
    # Which baseline speculative options survive (option strings or dests; the rest of the group
    # whose dest starts with speculative_ is dropped), extra dests to drop with the group, and which
    # speculation-only environment variables of the baseline stay (the others are unset).
    carry: tuple[str, ...] = DEFAULT_CARRY
    drop: tuple[str, ...] = ()
    env_keep: tuple[str, ...] = ()
    cuda_graph: str | None = None   # keep | rescale | refuse, None when not set: fleetspec.model.graphsize


@dataclass(frozen=True)
class Smoke:
    imports: tuple[str, ...] = ()
    parse_args: bool = True
    kernels: bool = False
    ddtree_sample: bool = False
    # before-switch: the verdict is awaited while the old engine still serves (a patch set that does
    # not import on the host never takes the service down). beside-load: the switch does not wait;
    # the verdict is awaited while the new engine loads, before its probes (a deploy costs about the
    # engine's restart; a failing smoke test costs the service its revert: detection + one load).
    when: str = "before-switch"
    # a passing verdict is replayed for the same runner input and release content while nothing
    # under the host python's import path changed since it ran (ctime); false: always run again
    reuse: bool = True


@dataclass(frozen=True)
class GenerateProbe:
    prompt: str = "The capital of France is"
    max_new_tokens: int = 16


@dataclass(frozen=True)
class Probes:
    ready_timeout: float = 900.0
    interval: float = 0.5
    generate: GenerateProbe = field(default_factory=GenerateProbe)


@dataclass(frozen=True)
class AcceptanceGate:
    min: float | None = None
    vs_baseline_tolerance: float | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class ThroughputGate:
    """Also measured at the host's serving concurrency: ops/gates.serving_level."""
    min_ratio: float | None = None
    concurrency: tuple[int, ...] = (1,)
    requests: int = 16
    dry_run: bool = False
    serving_concurrency: int | None = None
    max_concurrency: int = 64


@dataclass(frozen=True)
class ParityGate:
    max_new_tokens: int = 32
    hybrid_tolerance_tokens: int = 0
    dry_run: bool = False


@dataclass(frozen=True)
class Gates:
    acceptance: AcceptanceGate | None = None
    throughput: ThroughputGate | None = None
    parity: ParityGate | None = None


@dataclass(frozen=True)
class Guard:
    """Opt-in crash-loop guard: when the service hits its start limit after fleetspec has left,
    systemd runs the release's rollback.sh (OnFailure=) and the host returns to its last good state."""

    burst: int = 3
    interval_s: int = 300


@dataclass(frozen=True)
class Playbook:
    path: Path
    algo: str
    speculative_algorithm: str
    description: str = ""
    options: Mapping[str, Scalar] = field(default_factory=lambda: MappingProxyType({}))
    hybrid: HybridRule | None = None
    launch: Launch = field(default_factory=Launch)
    patchsets: Mapping[str, Path] = field(default_factory=lambda: MappingProxyType({}))
    kernels: tuple[Path, ...] = ()
    # required: a kernel that does not match or load fails the deploy before the switch;
    # optional: the payload falls back to torch and the deploy says so
    kernel_policy: str = "optional"
    smoke: Smoke = field(default_factory=Smoke)
    probes: Probes = field(default_factory=Probes)
    gates: Gates = field(default_factory=Gates)
    guard: Guard | None = None
    keep_releases: int = 3
    bake: BakeSpec | None = None
    stop: StopSpec = field(default_factory=StopSpec)
    # GPU health checks (model/gpuhealth.CHECKS) this playbook's deploys do not refuse on
    gpu_waive: tuple[str, ...] = ()

    @property
    def playbooks_dir(self) -> Path:
        return self.path.parent

    def patchset_for(self, version: str) -> Path | None:
        return self.patchsets.get(version)


def available_algos(playbooks_dir: Path) -> list[str]:
    return sorted(p.stem for p in Path(playbooks_dir).glob("*.yaml"))


def load_playbook_for(root: Path, algo: str) -> Playbook:
    """The playbook of `algo` under `<root>/playbooks/`; an unknown algo names the known ones."""
    pdir = Path(root) / "playbooks"
    path = pdir / f"{algo}.yaml"
    if not is_name(algo) or not path.is_file():
        known = ", ".join(available_algos(pdir)) or "none"
        raise UserError(f"unknown algo {algo!r}: no {path} (known: {known})")
    return load_playbook(path)


def load_playbook(path: str | Path) -> Playbook:
    path = Path(path).resolve()
    top = Fields(load_yaml_file(path), path)
    base = path.parent
    algo = top.get("algo", str, required=True)
    if algo != path.stem:
        top.fail("algo", f"expected {path.stem!r} (the file's name), got {algo!r}")
    if not is_name(algo):       # release ids carry it into paths, rollback.sh and the ledger
        top.fail("algo", "letters, digits, '_', '.' or '-' starting with a letter or digit (it is the file's "
                         f"name, and release ids carry it), got {algo!r}")
    spec_alg = top.get("speculative_algorithm", str, required=True)
    description = top.get("description", str, "")
    options = _options(top.sub("options"))
    hybrid = _hybrid(top, options)
    launch = _launch(top.sub("launch"))
    patchsets = _patchsets(top.sub("patchsets"), base)
    kernels = _kernels(top, base)
    kernel_policy = top.choice("kernel_policy", KERNEL_POLICIES, "optional")
    smoke = _smoke(top.sub("smoke"))
    probes = _probes(top.sub("probes"))
    gates = _gates(top.sub("gates"))
    guard = _guard(top)
    keep = _positive(top, "keep_releases", int, 3)
    bake, stop = bake_from(top), stop_from(top)
    gpu_waive = _gpu_health(top)
    top.done()
    return Playbook(path=path, algo=algo, speculative_algorithm=spec_alg, description=description,
                    options=options, hybrid=hybrid, launch=launch, patchsets=patchsets,
                    kernels=kernels, kernel_policy=kernel_policy, smoke=smoke, probes=probes, gates=gates, guard=guard, keep_releases=keep,
                    bake=bake, stop=stop, gpu_waive=gpu_waive)


def _options(f: Fields) -> Mapping[str, Scalar]:
    out = {}
    for name in f.data:
        if not isinstance(name, str) or not name.isidentifier():
            f.fail(str(name), "option names are identifiers (letters, digits, _)")
        out[name] = f.get(name, (bool, int, float, str))
    f.done()
    return MappingProxyType(out)


def _hybrid(top: Fields, options: Mapping[str, Scalar]) -> HybridRule | None:
    f = top.optional_sub("hybrid")
    if f is None:
        return None
    option = f.get("option", str, required=True)
    if option not in options:
        f.fail("option", f"expected the name of an option (one of: {', '.join(options) or 'none'}), got {option!r}")
    rule = HybridRule(option=option, auto=f.get("auto", str, required=True),
                      otherwise=f.get("otherwise", str, required=True), refuse=f.str_list("refuse"))
    if rule.auto in rule.refuse:
        f.fail("auto", f"{rule.auto!r} is also listed under refuse")
    f.done()
    return rule


def _launch(f: Fields) -> Launch:
    flags = []
    raw = f.get("flags", list, [])
    for i, item in enumerate(raw):
        key = f"flags[{i}]"
        if isinstance(item, list):
            flags.append(Flag(_tokens(item, f, key)))
        elif isinstance(item, dict):
            sub = Fields(item, f.path, f.key(key))
            tokens = sub.get("flag", list, required=True)
            when = sub.get("when", str, None)
            sub.done()
            flags.append(Flag(_tokens(tokens, f, f"{key}.flag"), when))
        else:
            f.fail(key, f"expected a list of argv tokens or {{flag: [...], when: ...}}, got {describe(item)}")
    env_f = f.sub("env")
    env = {}
    for name in env_f.data:
        if not isinstance(name, str) or not name.replace("_", "a").isalnum() or name[0].isdigit():
            env_f.fail(str(name), "environment names are letters, digits and _")
        value = env_f.get(name, (str, int, float, bool))
        env[name] = str(value).lower() if isinstance(value, bool) else str(value)
    env_f.done()
    secret_env = f.str_list("secret_env")
    carry = f.str_list("carry", DEFAULT_CARRY)
    drop = f.str_list("drop")
    env_keep = f.str_list("env_keep")
    cuda_graph = f.choice("cuda_graph", ("keep", "rescale", "refuse"), None)
    for key, names in (("carry", carry), ("drop", drop)):
        for i, name in enumerate(names):
            if not (name.startswith("--") or name.replace("_", "a").isalnum()):
                f.fail(f"{key}[{i}]", f"expected an option string (--speculative-…) or a dest name, got {name!r}")
    f.done()
    return Launch(flags=tuple(flags), env=MappingProxyType(env), secret_env=secret_env, carry=carry, drop=drop,
                  env_keep=env_keep, cuda_graph=cuda_graph)


def _tokens(items: list[Any], f: Fields, key: str) -> tuple[str, ...]:
    if not items:
        f.fail(key, "expected at least one argv token")
    out = []
    for j, tok in enumerate(items):
        if isinstance(tok, bool) or not isinstance(tok, (str, int, float)):
            f.fail(f"{key}[{j}]", f"expected a string, got {describe(tok)}")
        out.append(str(tok))
    if not out[0].startswith("--"):
        f.fail(f"{key}[0]", f"expected an option starting with --, got {out[0]!r}")
    return tuple(out)


def _patchsets(f: Fields, base: Path) -> Mapping[str, Path]:
    out = {}
    for version in list(f.data):
        rel = f.get(version, str)
        out[str(version)] = _existing_dir(f, str(version), rel, base)
    f.done()
    return MappingProxyType(out)


KERNEL_POLICIES = ("required", "optional")
SMOKE_WHEN = ("before-switch", "beside-load")


def _kernels(top: Fields, base: Path) -> tuple[Path, ...]:
    out = []
    for i, rel in enumerate(top.str_list("kernels")):
        folder = _existing_dir(top, f"kernels[{i}]", rel, base)
        if not (folder / "kernel.json").is_file():
            top.fail(f"kernels[{i}]", f"folder {rel} has no kernel.json")
        out.append(folder)
    return tuple(out)


def _existing_dir(f: Fields, key: str, rel: str, base: Path) -> Path:
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        f.fail(key, f"expected a folder relative to {base}, got {rel!r}")
    folder = base / p
    if not folder.is_dir():
        f.fail(key, f"folder {rel} not found under {base}")
    return folder


def _smoke(f: Fields) -> Smoke:
    s = Smoke(imports=f.str_list("imports"), parse_args=f.get("parse_args", bool, True),
              kernels=f.get("kernels", bool, False), ddtree_sample=f.get("ddtree_sample", bool, False),
              when=f.choice("when", SMOKE_WHEN, Smoke.when), reuse=f.get("reuse", bool, True))
    f.done()
    return s


def _probes(f: Fields) -> Probes:
    g = f.sub("generate")
    gen = GenerateProbe(prompt=g.get("prompt", str, GenerateProbe.prompt),
                        max_new_tokens=_positive(g, "max_new_tokens", int, GenerateProbe.max_new_tokens))
    g.done()
    p = Probes(ready_timeout=_positive(f, "ready_timeout", float, Probes.ready_timeout),
               interval=_positive(f, "interval", float, Probes.interval), generate=gen)
    f.done()
    return p


def _guard(top: Fields) -> Guard | None:
    f = top.optional_sub("guard")
    if f is None:
        return None
    guard = Guard(burst=_positive(f, "burst", int, Guard.burst), interval_s=_positive(f, "interval_s", int, Guard.interval_s))
    f.done()
    return guard


def _gpu_health(top: Fields) -> tuple[str, ...]:
    """`gpu_health: {waive: [check, …]}`: the GPU checks this playbook's deploys let pass."""
    from fleetspec.model.gpuhealth import waiver_errors

    f = top.optional_sub("gpu_health")
    if f is None:
        return ()
    waive = f.get("waive", list, [])
    problem = waiver_errors(waive)
    if problem:
        f.fail("waive", problem)
    f.done()
    return tuple(waive)


def _positive(f: Fields, name: str, kind: Kind, default: Any) -> Any:
    value = f.get(name, kind, default)
    if value <= 0:
        f.fail(name, f"expected a positive number, got {value}")
    return value


def _gates(f: Fields) -> Gates:
    def maybe(name: str) -> Fields | None:
        if f.data.get(name) is None:
            f.get(name, dict, None)
            return None
        return f.sub(name)

    acceptance = throughput = parity = None
    if (a := maybe("acceptance")) is not None:
        acceptance = AcceptanceGate(min=a.get("min", float, None),
                                    vs_baseline_tolerance=a.get("vs_baseline_tolerance", float, None),
                                    dry_run=a.get("dry_run", bool, False))
        a.done()
    if (t := maybe("throughput")) is not None:
        conc = t.get("concurrency", list, [1])
        for i, c in enumerate(conc):
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                t.fail(f"concurrency[{i}]", f"expected a positive integer, got {describe(c)}")
        if (serving := t.get("serving_concurrency", int, None)) is not None and serving < 0:
            t.fail("serving_concurrency", f"expected a count of requests (0: not measured), got {serving}")
        throughput = ThroughputGate(min_ratio=t.get("min_ratio", float, None), concurrency=tuple(conc),
                                    requests=_positive(t, "requests", int, 16), dry_run=t.get("dry_run", bool, False),
                                    serving_concurrency=serving, max_concurrency=_positive(t, "max_concurrency", int, 64))
        t.done()
    if (p := maybe("parity")) is not None:
        parity = ParityGate(max_new_tokens=_positive(p, "max_new_tokens", int, 32),
                            hybrid_tolerance_tokens=p.get("hybrid_tolerance_tokens", int, 0),
                            dry_run=p.get("dry_run", bool, False))
        p.done()
    f.done()
    return Gates(acceptance=acceptance, throughput=throughput, parity=parity)

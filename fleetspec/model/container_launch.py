"""Container launch forms on a systemd host (pure): `docker run` / `podman run` ExecStart lines.

`<runtime> [runtime options] [container] run [run options] IMAGE [COMMAND [ARG…]]` is split the
way the runtime's own parser (cobra/pflag) splits it, from a table of which options take a value
(model.container_options, read from the programs' --help): `--opt value`, `--opt=value`,
`-o value`, `-ovalue`, `-o=value`, clusters such as `-it` or `-itp 8000:8000`, `--` ending the
options; the first word that is not an option is the image, the rest is the command. Every word
up to and including the image is kept byte for byte; the command inside the container is
classified and derived exactly as a bare-metal ExecStart (model.launch), and the host argv is
re-emitted as the same runtime words followed by the new command.

Refused, in one line, with nothing changed: an unknown runtime or subcommand, an option missing
from the table (its arity is unknown), no image, no command after the image (the image's
entrypoint hides it), a shell or other wrapper inside the container (`bash -c …`). With no
`--entrypoint` the command still runs behind the image's own ENTRYPOINT, which only the image
can tell (`podman image inspect`): `needs_image_entrypoint` says so, for the host check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Sequence

from fleetspec.model import launch
from fleetspec.model.container_options import RUNTIMES, RuntimeOptions, load
from fleetspec.model.launch import LaunchForm, LaunchRefused

ADVICE = ("run the engine command itself after the image (`… IMAGE python3 -m sglang.launch_server …` or "
          "`… IMAGE sglang serve …`), runtime settings as runtime options")


@dataclass(frozen=True)
class RuntimeOption:
    """One option as written: its words, the name it was given by (a short cluster up to the letter
    that takes the value: `-itp` of `-itp 8000:8000`, `-e` of `-eA=1`), and its value (None: a flag)."""

    tokens: tuple[str, ...]
    name: str
    value: str | None = None


@dataclass(frozen=True)
class ContainerRun:
    """A `docker run` / `podman run` ExecStart; argv[:image_at + 1] is kept byte for byte."""

    runtime: str                      # docker | podman
    prefix: str                       # ExecStart's prefix characters, kept
    path: str                         # the executable systemd runs
    argv: tuple[str, ...]             # the whole host argv
    image_at: int                     # argv[image_at] is the image
    main_options: tuple[RuntimeOption, ...]
    options: tuple[RuntimeOption, ...]
    entrypoint: tuple[str, ...] | None    # --entrypoint's words (None: the image's own)
    engine: LaunchForm                # the command inside the container, classified

    @property
    def image(self) -> str:
        return self.argv[self.image_at]

    @property
    def head(self) -> list[str]:
        return list(self.argv[:self.image_at + 1])

    @property
    def needs_image_entrypoint(self) -> bool:
        """No --entrypoint: the image's ENTRYPOINT (if any) runs in front of the command."""
        return self.entrypoint is None

    def option(self, *names: str) -> list[str | None]:
        """Values of every option given by one of `names` (long or short spelling), in order."""
        return [o.value for o in self.options if o.name in names or (o.name[:1] == "-" and o.name[1:2] != "-"
                                                                      and "-" + o.name[-1] in names)]

    @property
    def label(self) -> str:
        return f"{self.runtime} run {self.image} ({self.engine.label})"

    def env(self) -> dict[str, str | None]:
        """The engine's `-e`/`--env` variables as written: NAME -> value (None: `-e NAME`, passed
        through from the runtime client's own environment, which is the unit's)."""
        out: dict[str, str | None] = {}
        for value in self.option("-e", "--env"):
            if value is not None:
                name, eq, rest = value.partition("=")
                out[name] = rest if eq else None
        return out

    def flags_given(self, *names: str) -> list[str]:
        """Which of the flag options `names` (long or short, also inside a short cluster such as
        `-dit`) the operator wrote, as written."""
        return [o.tokens[0] for o in self.options
                if o.name in names or _short_cluster_of(o, frozenset(n for n in names if not n.startswith("--")))]


# `-d`: the runtime client exits once the container started, so systemd supervises a process that is
# gone: a crash of the engine never fails the unit, and a restart races the old container.
DETACH = ("-d", "--detach")
# `-t`: a pseudo-terminal for the engine; harmless under systemd (the output still reaches the journal).
TTY = ("-t", "--tty")


def supervision_problem(run: ContainerRun) -> str | None:
    """A runtime option under which systemd would not supervise the engine (pure), or None.
    podman's `-d` with `--sdnotify=conmon|container` (what Quadlet writes, beside Type=notify) is
    supervised: conmon tells systemd its pid and stays for the container's life."""
    given = run.flags_given(*DETACH)
    notify = [v for v in run.option("--sdnotify") if v in ("conmon", "container")]
    if given and run.runtime == "podman" and notify:
        return None
    if given:
        return (f"`{run.runtime} run {given[0]}` detaches the container: the runtime client exits at once, so "
                f"systemd never sees the engine (a crash would not fail the unit, probes and rollback could not "
                f"tell); drop {given[0]} from the ExecStart (systemd keeps the container in the foreground)")
    return None


def handling_notes(run: ContainerRun) -> list[str]:
    """What a deploy keeps as written that an operator may wonder about (pure): for the plan."""
    given = run.flags_given(*TTY)
    if given:
        return [f"runtime option {given[0]} kept as written: the engine gets a pseudo-terminal, its output "
                f"still reaches the journal"]
    return []


def split_options(argv: Sequence[str], i: int, table: dict[str, bool], what: str) -> tuple[list[RuntimeOption], int]:
    """pflag's parse from argv[i] to the first word that is not an option; (options, its index)."""
    out: list[RuntimeOption] = []
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return out, i + 1
        if not word.startswith("-") or word == "-":
            return out, i
        opt = _long(argv, i, table, what) if word.startswith("--") else _short(argv, i, table, what)
        out.append(opt)
        i += len(opt.tokens)
    return out, i


def _long(argv: Sequence[str], i: int, table: dict[str, bool], what: str) -> RuntimeOption:
    name, eq, value = argv[i].partition("=")
    takes = _lookup(table, name, what)
    if eq or not takes:
        return RuntimeOption((argv[i],), name, value if eq else None)
    if i + 1 >= len(argv):
        raise LaunchRefused(f"{what} with {name} and no value", "the runtime refuses it", "fix the ExecStart first")
    return RuntimeOption((argv[i], argv[i + 1]), name, argv[i + 1])


def _short(argv: Sequence[str], i: int, table: dict[str, bool], what: str) -> RuntimeOption:
    """A cluster such as `-it`, `-p8000:8000`, `-itp 8000:8000` or `-e=A=1` (pflag's rules)."""
    letters = argv[i][1:]
    for n, letter in enumerate(letters):
        name = "-" + letter
        takes = _lookup(table, name, what)
        rest = letters[n + 1:]
        cluster = "-" + letters[:n + 1]          # the letters up to the one that takes the value
        if rest.startswith("="):
            return RuntimeOption((argv[i],), cluster, rest[1:])
        if not takes:
            continue
        if rest:
            return RuntimeOption((argv[i],), cluster, rest)
        if i + 1 >= len(argv):
            raise LaunchRefused(f"{what} with {name} and no value", "the runtime refuses it", "fix the ExecStart first")
        return RuntimeOption((argv[i], argv[i + 1]), cluster, argv[i + 1])
    return RuntimeOption((argv[i],), argv[i], None)


def _lookup(table: dict[str, bool], name: str, what: str) -> bool:
    if name not in table:
        raise LaunchRefused(f"{what} with the option {name}", "fleetspec's table of the runtime's options does not "
                            "know it, so it cannot tell where the image starts", "spell the option as the runtime's "
                            "--help lists it")
    return table[name]


def runtime_of(path: str) -> str | None:
    name = PurePosixPath(path).name
    return name if name in RUNTIMES else None


def parse_run(argv: Sequence[str], *, path: str | None = None, prefix: str = "",
              options: RuntimeOptions | None = None) -> ContainerRun:
    """The container form of one ExecStart command, or LaunchRefused naming what is refused."""
    argv = list(argv)
    path = path or argv[0]
    runtime = runtime_of(path)
    if runtime is None:
        raise LaunchRefused(f"an unknown container runtime ({PurePosixPath(path).name})", "fleetspec reads "
                            "`docker run` and `podman run` only", ADVICE)
    table = options or load(runtime)
    main, i = split_options(argv, 1, table.main, f"`{runtime}`")
    sub = argv[i:i + 2]
    if sub[:1] == ["run"]:
        run_at = i
    elif sub == ["container", "run"]:
        run_at = i + 1
    else:
        word = " ".join(sub[:1]) or "(nothing)"
        raise LaunchRefused(f"`{runtime} {word}`", "only `run` starts a container whose command fleetspec can read",
                            "for compose, fleetspec reads the compose file's service" if word == "compose" else ADVICE)
    run_table = {**table.main, **table.run} if runtime == "podman" else table.run   # podman's globals persist
    opts, image_at = split_options(argv, run_at + 1, run_table, f"`{runtime} run`")
    if image_at >= len(argv):
        raise LaunchRefused(f"`{runtime} run` without an image", "the runtime refuses it", "fix the ExecStart first")
    entrypoint = _entrypoint(runtime, opts)
    inside = [*(entrypoint or ()), *argv[image_at + 1:]]
    if not inside or (entrypoint is None and inside[0].startswith("-")):
        raise LaunchRefused(f"`{runtime} run {argv[image_at]}` with no engine command", "the image's entrypoint hides the "
                            "engine command, so fleetspec cannot see or replace its flags", ADVICE)
    engine = classify_inside(inside, runtime)
    return ContainerRun(runtime, prefix, path, tuple(argv), image_at, tuple(main), tuple(opts),
                        None if entrypoint is None else tuple(entrypoint), engine)


def _entrypoint(runtime: str, opts: Sequence[RuntimeOption]) -> list[str] | None:
    """--entrypoint's words: docker takes one executable; podman also a JSON array (`["python3", "-m"]`)."""
    values = [o.value for o in opts if o.name == "--entrypoint"]
    if not values:
        return None
    value = values[-1] or ""
    if runtime == "podman" and value.startswith("["):
        try:
            words = json.loads(value)
        except ValueError:
            words = None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise LaunchRefused("`podman run --entrypoint` with a malformed JSON array", "podman refuses it",
                                "fix the ExecStart first")
        return list(words)
    return [value] if value else []


def classify_inside(inside: Sequence[str], runtime: str) -> LaunchForm:
    """The engine command inside the container, classified as a bare-metal ExecStart is."""
    try:
        return launch.classify(list(inside), path=inside[0])
    except LaunchRefused as err:
        raise LaunchRefused(f"`{runtime} run` with {err.form} inside the container", err.why, ADVICE) from None


@dataclass(frozen=True)
class ContainerDerived:
    argv: list[str]              # the new host argv: the kept runtime words, then the new command
    engine: launch.Derived       # what the derivation did to the command inside


def derive(run: ContainerRun, table: launch.OptionTable, flags: Sequence[str], *, carry: Sequence[str] = (),
           drop: Sequence[str] = (), version: str | None = None) -> ContainerDerived:
    """The engine command derived exactly as for bare metal, behind the unchanged runtime words."""
    derived = launch.derive(run.engine, table, flags, carry=carry, drop=drop, version=version)
    return ContainerDerived(argv=host_argv(run, derived.argv), engine=derived)


def host_argv(run: ContainerRun, engine_argv: Sequence[str]) -> list[str]:
    """The runtime words up to the image, kept, then the new engine command (less the
    --entrypoint words, which must be unchanged)."""
    skip = len(run.entrypoint or ())
    keep = max(skip, run.engine.start)
    if list(engine_argv[:keep]) != list(run.engine.argv[:keep]):
        raise LaunchRefused(f"`{run.runtime} run --entrypoint`", "the derived command would change the "
                            "entrypoint's words", ADVICE)
    return [*run.head, *engine_argv[skip:]]


RELEASE_LABEL = "fleetspec.release"


def release_mount(release_dir: str) -> list[str]:
    """The one folder of fleetspec's state a container sees: this release's, read-only, at the same
    path (its overlay's links point into the image's site-packages, which the image holds at the
    host's path). Never the state root: the engine runs as root in the container, and every other
    service's baseline, each release's secrets/env and the run folder would be readable there."""
    return ["-v", f"{release_dir}:{release_dir}:ro"]


def without_env(run: ContainerRun, names: Sequence[str]) -> list[str]:
    """argv up to the image with the `-e NAME[=…]` options of `names` left out (pure): how a release
    drops the baseline's speculation-only variables, as a bare unit's drop-in unsets them. A name
    given inside a short cluster (`-ie A=1`) cannot be cut out word by word and is refused."""
    drop = set(names)
    if not drop:
        return list(run.argv[:run.image_at])
    start = run.image_at - sum(len(o.tokens) for o in run.options)
    if [w for o in run.options for w in o.tokens] != list(run.argv[start:run.image_at]):
        raise LaunchRefused(f"`{run.runtime} run` whose options fleetspec cannot split", "it would not drop "
                            f"{sorted(drop)[0]} exactly", "fix the ExecStart first")
    kept: list[str] = []
    for o in run.options:
        cluster = o.name[:1] == "-" and o.name[1:2] != "-" and len(o.name) > 2 and o.name[-1] == "e"
        if o.value is not None and o.value.partition("=")[0] in drop and (o.name in ("-e", "--env") or cluster):
            if cluster:
                raise LaunchRefused(f"`{run.runtime} run {o.tokens[0]}`", f"{o.value.partition('=')[0]} sits in a "
                                    "cluster of short options", "write it as its own `-e NAME=VALUE`")
            continue
        kept.extend(o.tokens)
    return [*run.argv[:start], *kept]


def with_release(run: ContainerRun, engine_argv: Sequence[str], *, release_id: str, release_dir: str,
                 env: dict[str, str], drop_env: Sequence[str] = ()) -> list[str]:
    """The host argv that runs a release: every word the operator wrote up to the image kept in
    place, then, just before the image, `--pull=never` (a deploy or rollback never fetches an image),
    the release id as a label, the release folder bind-mounted read-only (release_mount; `env`
    names paths inside it, not the `current` link, which is not mounted) and fleetspec's environment
    (PYTHONPATH first on the import path); then the derived engine command. `drop_env`: the
    baseline's speculation-only `-e` variables the new algorithm must not see (without_env)."""
    written = {str(v).split("=", 1)[0] for v in run.option("-e", "--env") if v is not None}
    clash = sorted(written & set(env))
    if clash:
        raise LaunchRefused(f"`{run.runtime} run -e {clash[0]}=…`", "fleetspec sets it for the release "
                            "and would hide the operator's value", "move it into the image or the unit's "
                            "environment (`-e NAME` without a value passes it through)")
    tail = host_argv(run, engine_argv)[run.image_at:]
    added = ["--pull=never", "--label", f"{RELEASE_LABEL}={release_id}", *release_mount(release_dir)]
    for name, value in env.items():
        added += ["-e", f"{name}={value}"]
    return [*without_env(run, drop_env), *added, *tail]


# Options a second, short-lived container of the same unit must not repeat: a fixed name, a
# detached or restarted container, published ports, the healthcheck, files only one may own.
NOT_FOR_SMOKE = frozenset({"--name", "--rm", "-d", "--detach", "--restart", "-p", "--publish", "-P", "--cgroups",
                           "--publish-all", "--cidfile", "--pidfile", "--conmon-pidfile", "--replace",
                           "--sdnotify", "-t", "--tty", "-i", "--interactive", "--health-cmd",
                           "--health-interval", "--health-retries", "--health-start-period",
                           "--health-timeout", "--health-on-failure", "--label", "-l"})


def smoke_argv(run: ContainerRun, release: Sequence[str], python_args: Sequence[str]) -> list[str]:
    """A container that runs the smoke tests in the unit's image with the unit's mounts, devices,
    environment, IPC and network (and `release`'s run options, with_release's): `<runtime> run
    --rm` with the unit's options less NOT_FOR_SMOKE, the engine's python as the entrypoint."""
    if run.engine.form != "launch_server":
        raise LaunchRefused(f"`{run.runtime} run … {run.engine.label}`", "the smoke tests need the python "
                            "that runs the engine", ADVICE)
    kept = [w for o in run.options if o.name not in NOT_FOR_SMOKE and not _short_cluster_of(o, NOT_FOR_SMOKE)
            for w in o.tokens]
    main = [w for o in run.main_options for w in o.tokens]
    return [run.path, *main, "run", "--rm", *kept, *release, "--entrypoint", run.engine.argv[0],
            run.image, *python_args]


def _short_cluster_of(o: RuntimeOption, names: frozenset[str]) -> bool:
    """`-it`, `-dit`: a cluster of short flags, any of which is in `names`."""
    word = o.tokens[0]
    return word.startswith("-") and not word.startswith("--") and any(f"-{c}" in names for c in word[1:])

"""Container launch forms (model.container_launch, container_quadlet, container_compose) against
published configurations (tests/fixtures/container_corpus.yaml), the runtimes' own option tables
(read from the real programs' --help), and `podman inspect` output captured from podman 4.3.1."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetspec import systemd_unit
from fleetspec.model import container_compose, container_launch, container_options, container_quadlet, launch
from fleetspec.model.container_launch import ContainerRun, parse_run
from fleetspec.model.launch import LaunchRefused
from fleetspec.remote.facts import container_inspect

FIXTURES = Path(__file__).parents[1] / "fixtures"
HELP = FIXTURES / "containers"
CORPUS = yaml.safe_load((FIXTURES / "container_corpus.yaml").read_text())
FLAGS = ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/models/draft $x%y",
         "--speculative-ddtree-budget", "64"]
VERSIONS = ("0.5.13.post1", "0.5.23")


# The option tables are the real programs' -----------------------------------------------------------
@pytest.mark.parametrize("runtime,version", [("docker", "28.2.2"), ("podman", "4.3.1")])
def test_packaged_tables_are_what_the_real_help_says(runtime, version):
    packaged = json.loads((container_options.TABLES / f"{runtime}.json").read_text())
    run_help = (HELP / f"{runtime}-{version}-run-help.txt").read_text()
    main_help = (HELP / f"{runtime}-{version}-help.txt").read_text()
    assert packaged == container_options.table_data(runtime, version, run_help, main_help, packaged["extra"])
    table = container_options.load(runtime)
    assert table.run["--volume"] and table.run["-v"] and table.run["--shm-size"] and table.run["--name"]
    assert not table.run["--rm"] and not table.run["-d"] and not table.run["--init"] and not table.run["-t"]
    for name, extra in packaged["extra"]["run"].items():      # hidden or newer flags: documented, not guessed
        assert extra["source"] and name not in packaged["run"]
    program = shutil.which(runtime)
    if program:   # the program on this machine, when it is that version: its help is still the captured one
        version_line = subprocess.run([program, "--version"], capture_output=True, text=True).stdout
        if version in version_line:
            live = subprocess.run([program, "run", "--help"], capture_output=True, text=True).stdout
            assert container_options.options_from_help(live) == container_options.options_from_help(run_help)


def test_options_from_help_reads_cobra_lines():
    text = ("  -a, --attach list      Attach\n      --rm                   Remove\n"
            "      --shm-size <number>[<unit>]   Size\n                 continued --not-a-flag x\n")
    assert container_options.options_from_help(text) == {"--attach": True, "-a": True, "--rm": False,
                                                         "--shm-size": True}


# pflag's splitting ------------------------------------------------------------------------------------
@pytest.mark.parametrize("words,options,image_at", [
    ("docker run -it img python3 -m sglang.launch_server --model-path m", ["-it"], 3),
    ("docker run -itp 8000:8000 img python3 -m sglang.launch_server --model-path m", ["-itp"], 4),
    ("docker run -p8000:8000 -e=A=1 img python3 -m sglang.launch_server --model-path m", ["-p8000:8000", "-e=A=1"], 4),
    ("docker run --rm=false --name=x --name y img python3 -m sglang.launch_server --model-path m",
     ["--rm=false", "--name=x", "--name"], 6),
    ("docker run -v /a:/b -- img python3 -m sglang.launch_server --model-path m", ["-v"], 5),
    ("docker run -e -x img python3 -m sglang.launch_server --model-path m", ["-e"], 4),   # a value may start with -
    ("docker --log-level debug container run img python3 -m sglang.launch_server --model-path m", [], 5),
    ("podman run --root /x --cgroup-manager=cgroupfs img python3 -m sglang.launch_server --model-path m",
     ["--root", "--cgroup-manager=cgroupfs"], 5),    # podman's global flags persist into run
])
def test_runtime_options_split_as_pflag_does(words, options, image_at):
    run = parse_run(words.split())
    assert [o.name if o.value is None or o.tokens[0] == o.name else o.tokens[0] for o in run.options] == options
    assert run.image_at == image_at and run.image == "img"
    assert run.engine.args == ["--model-path", "m"]


@pytest.mark.parametrize("words,why", [
    ("nerdctl run img python3 -m sglang.launch_server --model-path m", "unknown container runtime (nerdctl)"),
    ("docker exec c python3 -m sglang.launch_server", "`docker exec`"),
    ("docker run --frobnicate img python3", "the option --frobnicate"),
    ("docker run --gpus", "--gpus and no value"),
    ("docker run --rm", "without an image"),
    ("docker run img", "no engine command"),
    ("docker run img --model-path m", "entrypoint hides"),
    ("docker run img sh -c 'python3 -m sglang.launch_server'", "shell wrapper (sh -c …) inside the container"),
    ("docker run img python3 -m vllm.entrypoints.openai.api_server", "python -m vllm.entrypoints.openai.api_server"),
    ("podman run --entrypoint=[oops img -m x", "malformed JSON array"),
    ("podman run --gpus all img python3", "the option --gpus"),  # not podman 4.3.1's … but see the extra table
])
def test_refusals_are_one_line_naming_the_form(words, why):
    if "--gpus all img python3" in words:   # podman ≥ 5 documents --gpus: the table knows it (extra)
        assert parse_run(words.split() + ["-m", "sglang.launch_server", "--model-path", "m"]).option("--gpus") == ["all"]
        return
    import shlex
    with pytest.raises(LaunchRefused) as err:
        parse_run(shlex.split(words))
    assert why in str(err.value) and "\n" not in str(err.value)


# The published corpus --------------------------------------------------------------------------------
def test_corpus_is_published_and_large_enough():
    ids = [c["id"] for c in CORPUS]
    assert len(ids) == len(set(ids)) and len(CORPUS) >= 15
    assert all(c.get("source") and c.get("kind") for c in CORPUS)
    assert sum(c["expect"] == "parsed" for c in CORPUS) >= 12
    assert {c["kind"] for c in CORPUS} >= {"docker run unit", "podman run unit", "quadlet", "compose", "compose up unit"}


def _parse(case):
    if "unit" in case:
        command = systemd_unit.effective_exec_command(case["unit"])
        return container_compose.classify_exec(list(command.argv), path=command.path, prefix=command.flags)
    if "quadlet" in case:
        return container_quadlet.parse_quadlet(case["quadlet"])
    return container_compose.parse_compose(case["compose"])


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_corpus_case(case):
    if case["expect"] != "parsed":
        with pytest.raises(LaunchRefused) as err:
            _parse(case)
        assert case["expect"].split(":", 1)[1].strip() in str(err.value), str(err.value)
        assert "\n" not in str(err.value)
        return
    got = _parse(case)
    if case["kind"] == "compose up unit":
        assert list(got.files) == case["files"]
        return
    if "runtime" in case:
        assert got.runtime == case["runtime"]
    assert got.image == case["image"] and got.engine.form == case["engine"]
    if "options" in case:
        assert [o.tokens[0] if "=" in o.tokens[0] else o.name for o in got.options] == case["options"]
    for version in VERSIONS:
        _check_derived(case, got, launch.load_table(version), version)


def _check_derived(case, got, table, version):
    if isinstance(got, ContainerRun):
        derived = container_launch.derive(got, table, FLAGS, version=version)
        assert derived.argv[:got.image_at + 1] == list(got.argv[:got.image_at + 1])    # every runtime word kept
        assert derived.argv[got.image_at + 1:] == derived.engine.argv[len(got.entrypoint or ()):]
        assert FLAGS[1] in derived.argv and "--speculative-algorithm" in derived.argv
        line = systemd_unit.exec_line(derived.argv, got.prefix)
        back = systemd_unit.effective_exec_command(f"[Service]\nExecStart=\nExecStart={line}\n")
        assert list(back.argv) == derived.argv and back.path == got.path
        again = parse_run(derived.argv)
        assert again.options == got.options and again.image == got.image
    elif isinstance(got, container_quadlet.QuadletContainer):
        text = container_quadlet.derive_quadlet(got, table, FLAGS, version=version)
        before, after = case["quadlet"].splitlines(), text.splitlines()
        exec_first, exec_last = got.exec_entry.first, got.exec_entry.last
        assert before[:exec_first] == after[:exec_first]
        assert before[exec_last + 1:] == after[exec_first + 1:]
        assert after[exec_first].startswith("Exec=") and "/models/draft $$x%%y" in after[exec_first]
        again = container_quadlet.parse_quadlet(text)
        assert FLAGS[3] in again.engine.argv and again.image == got.image
    else:
        text = container_compose.derive_compose(case["compose"], got, table, FLAGS, version=version)
        start, end = got.command_span
        assert text[:start] == case["compose"][:start]
        assert text[len(text) - (len(case["compose"]) - end):] == case["compose"][end:]
        again = container_compose.parse_compose(text, got.name)
        assert list(again.command) == [*got.command, *FLAGS]      # no speculative group: the flags go last


def test_entrypoint_words_are_never_rewritten():
    run = parse_run("docker run --entrypoint python3 img -m sglang.launch_server --model-path m "
                    "--speculative-algorithm EAGLE".split())
    assert run.entrypoint == ("python3",) and run.engine.argv[:3] == ("python3", "-m", "sglang.launch_server")
    derived = container_launch.derive(run, launch.load_table("0.5.23"), ["--speculative-algorithm", "DDTREE"])
    assert derived.argv == ("docker run --entrypoint python3 img -m sglang.launch_server --model-path m "
                            "--speculative-algorithm DDTREE").split()
    reset = parse_run("docker run --entrypoint= img python3 -m sglang.launch_server --model-path m".split())
    assert reset.entrypoint == () and reset.engine.path == "python3"


def test_compose_strings_and_interpolation():
    assert container_compose.words_of("a 'b c' \"d$$e\"", "x") == ["a", "b c", "d$e"]
    for bad, why in (("a && b", "shell operators"), ("--port $PORT", "interpolation"), (["a", 1], "list of strings")):
        with pytest.raises(LaunchRefused, match=why):
            container_compose.words_of(bad, "compose service s's command")
    up = container_compose.parse_compose_up("/usr/bin/docker-compose --project-directory /srv -f a.yaml -f b.yaml "
                                            "up -d --remove-orphans sglang".split())
    assert up.files == ("a.yaml", "b.yaml") and up.project_directory == "/srv" and up.services == ("sglang",)
    with pytest.raises(LaunchRefused, match="only `up`"):
        container_compose.parse_compose_up("/usr/bin/docker compose down".split())


def test_quadlet_refuses_what_systemd_would_resolve():
    base = "[Container]\nImage=img\nExec=python3 -m sglang.launch_server --model-path {}\n"
    with pytest.raises(LaunchRefused, match="needs the unit's context"):
        container_quadlet.parse_quadlet(base.format("/m/%i"))
    with pytest.raises(LaunchRefused, match=r"\$VARIABLES"):
        container_quadlet.parse_quadlet(base.format("$MODEL"))
    assert container_quadlet.parse_quadlet(base.format("/m/%%i$$x")).engine.args == ["--model-path", "/m/%i$x"]
    with pytest.raises(LaunchRefused, match="not a podman run option"):
        container_quadlet.parse_quadlet(base.format("/m") + "PodmanArgs=--ipc=host stray\n")
    with pytest.raises(LaunchRefused, match="without Image="):
        container_quadlet.parse_quadlet("[Container]\nExec=python3 -m sglang.launch_server\n")


# inspect output captured from the real programs ------------------------------------------------------
def test_inspect_of_captured_podman_and_published_docker_output():
    image = container_inspect.parse_image((HELP / "podman-4.3.1-image-inspect.json").read_text())
    assert image.entrypoint == () and image.cmd == ("/bin/true",) and image.digest.startswith("sha256:")
    assert image.repo_digests[0].startswith("localhost/fleetspec-probe@sha256:")
    wrapped = container_inspect.parse_image((HELP / "podman-4.3.1-image-inspect-entrypoint.json").read_text())
    assert wrapped.entrypoint == ("/bin/true", "--wrapped") and wrapped.labels == {"org.opencontainers.image.title": "probe"}
    docker = container_inspect.parse_image((HELP / "docker-image-inspect-published.json").read_text())
    assert docker.entrypoint == ("inspec",) and docker.digest is None and docker.id.startswith("sha256:1cba0d8a")
    c = container_inspect.parse_container((HELP / "podman-4.3.1-container-inspect-created.json").read_text())
    assert (c.name, c.status, c.running, c.restart_count, c.health) == ("fleetspec-probe", "created", False, 0, None)
    assert c.labels == {"fleetspec.release": "20261203T000000Z-ddtree-0001"} and c.image_id == image.id
    assert c.path == "/bin/true" and c.args == ("-m", "sglang.launch_server", "--model-path", "/models/q")
    out = (f"{container_inspect.MARK} version podman version 4.3.1\n{container_inspect.MARK} image 0\n"
           + (HELP / "podman-4.3.1-image-inspect.json").read_text() + f"\n{container_inspect.MARK} container 125\n\n")
    both = container_inspect.parse(out)
    assert both.version == "podman version 4.3.1" and both.image == image and both.container is None


def test_compose_refusal_names_the_sglang_service_not_the_one_listed_first():
    """The published smg file (a router service before the sglang worker), its worker's model given
    as `${MODEL}` as compose users write it: the refusal is the worker's interpolation, not the
    router's hidden entrypoint."""
    case = next(c for c in CORPUS if c["id"] == "smg-docs-compose-router-and-worker")
    text = case["compose"].replace("      - meta-llama/Llama-3.1-8B-Instruct", "      - ${MODEL}")
    with pytest.raises(LaunchRefused) as err:
        container_compose.parse_compose(text)
    assert "compose service worker's command with compose interpolation (${MODEL})" in str(err.value), str(err.value)


def test_compose_block_list_command_followed_by_a_key_is_rewritten_in_place():
    """The published smg file's worker: a block-list `command:` with `healthcheck:` after it. The
    rewrite keeps the line break and indentation before the next key (it once glued them together
    and the file no longer parsed)."""
    case = next(c for c in CORPUS if c["id"] == "smg-docs-compose-router-and-worker")
    got = container_compose.parse_compose(case["compose"])
    text = container_compose.derive_compose(case["compose"], got, launch.load_table("0.5.23"), FLAGS, version="0.5.23")
    assert "]\n    healthcheck:\n      test: [\"CMD\", \"curl\", \"-f\", \"http://localhost:8000/health\"]" in text
    assert container_compose.parse_compose(text).command == (*got.command, *FLAGS)

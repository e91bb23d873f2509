"""What each lab host looks like: its sglang version and venv, models, and systemd unit.

Two real shapes from the fleet: `ct129` (the operators' box: sglang 0.5.13.post1 in /root/ml-env,
a hybrid Qwen3.6-27B with NEXTN) and `ct200` (sglang 0.5.23, pure-attention Qwen3-8B with its
DFlash drafter). Any other host clones one of them by a simple rule: `ct<N>` with N < 150 clones
ct129, everything else clones ct200 (so ct201..ct207 are 0.5.23 DFlash boxes) except N in
150..199: those are `ct150`, the one shape where DDTree really verifies a tree (sglang 0.5.13.post1,
pure-attention Qwen3-8B, TP=1, DFlash): ct129 is hybrid and TP=2 and 0.5.23's worker builds no
trees, so on those DDTREE verifies linearly, as the real worker does.

`tn<N>` hosts are thin (issue 17, scale): ct200's shape, sglang install and unit, but the unit sets
FLEETSPEC_LAB_ENGINE=thin, so its engine answers the HTTP routes without importing sglang or torch
(engine/fleetspec_lab_engine/thin.py). Status, preflight, stage, smoke (real sglang over ssh),
render, switch, restart and probes all run for real; 32 of them fit on two cores.

`pd<N>` hosts run ct200's engine in a container: the unit's ExecStart is `podman run …` of a
local image holding the 0.5.23 venv and the stand-in (image.image_name), with the models and the
lab's engine settings bind-mounted read-only, as operators run SGLang's own images.

`pq<N>` hosts run the same container from a Podman Quadlet file: no unit under /etc/systemd/system,
but /etc/containers/systemd/sglang-qwen.container, from which Quadlet's generator writes
sglang-qwen.service at every boot and daemon-reload (lab.quadlet: the generator of podman 5.4,
the runtime Debian 12's podman 4.3.1).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from fleetspec.errors import UserError
from fleetspec.lab import image, podman_image, quadlet
from fleetspec.systemd_unit import systemd_quote

SERVICE = "sglang-qwen.service"
API_PORT = 30000

CT129_ARGV = (
    "/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3.6-27B "
    "--port 30000 --host 0.0.0.0 --tp-size 2 --mem-fraction-static 0.88 --context-length 131072 "
    "--max-running-requests 16 --mamba-full-memory-ratio 0.5 --mamba-scheduler-strategy extra_buffer "
    "--reasoning-parser qwen3 --tool-call-parser qwen3_coder --speculative-algo NEXTN "
    "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
).split()
CT200_ARGV = (
    "/opt/sglang/venv/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3-8B "
    "--port 30000 --host 0.0.0.0 --tp-size 1 --mem-fraction-static 0.85 --context-length 32768 "
    "--max-running-requests 32 --reasoning-parser qwen3 --tool-call-parser qwen25 --enable-metrics "
    "--speculative-algorithm DFLASH --speculative-draft-model-path /root/models/Qwen3-8B-DFlash "
    "--speculative-num-draft-tokens 16"
).split()
CT150_ARGV = (
    "/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/models/Qwen3-8B "
    "--port 30000 --host 0.0.0.0 --tp-size 1 --mem-fraction-static 0.85 --context-length 32768 "
    "--max-running-requests 32 --reasoning-parser qwen3 --tool-call-parser qwen25 "
    "--speculative-algorithm DFLASH --speculative-draft-model-path /root/models/Qwen3-8B-DFlash "
    "--speculative-num-draft-tokens 16"
).split()


# What `podman run` keeps of the operator's recipe on a pd host (docs/containers.md): host
# network, the models and the lab's engine settings read-only, a fixed container name.
PODMAN = "/usr/bin/podman"
PODMAN_RUN = [
    PODMAN, "run", "--rm", "--name", "sglang", "--network", "host", "--ipc", "host",
    "-v", "/root/models:/root/models:ro", "-v", "/etc/fleetspec-lab:/etc/fleetspec-lab:ro",
    "-e", "PYTHONUNBUFFERED=1", podman_image.image_name("0.5.23"),
]
PODMAN_ARGV = PODMAN_RUN + CT200_ARGV


@dataclass(frozen=True)
class Profile:
    like: str                     # ct129 | ct200 | ct150 | thin | podman | quadlet
    version: str
    argv: list[str]
    model_path: str
    draft_model_path: str
    gpu_count: int
    tags: list[str] = field(default_factory=list)

    @property
    def container(self) -> bool:
        return self.like in ("podman", "quadlet")

    @property
    def quadlet(self) -> bool:
        return self.like == "quadlet"

    @property
    def venv(self) -> str:
        return image.VENV[self.version]

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python3"


PROFILES = {
    "ct129": Profile("ct129", "0.5.13.post1", CT129_ARGV, "/root/models/Qwen3.6-27B",
                     "/root/models/Qwen3.6-27B-DFlash", 2, ["hybrid"]),
    "ct200": Profile("ct200", "0.5.23", CT200_ARGV, "/root/models/Qwen3-8B",
                     "/root/models/Qwen3-8B-DFlash", 1, []),
    "ct150": Profile("ct150", "0.5.13.post1", CT150_ARGV, "/root/models/Qwen3-8B",
                     "/root/models/Qwen3-8B-DFlash", 1, []),
    "thin": Profile("thin", "0.5.23", CT200_ARGV, "/root/models/Qwen3-8B",
                    "/root/models/Qwen3-8B-DFlash", 1, ["thin"]),
    "podman": Profile("podman", "0.5.23", PODMAN_ARGV, "/root/models/Qwen3-8B",
                      "/root/models/Qwen3-8B-DFlash", 1, ["container"]),
    "quadlet": Profile("quadlet", "0.5.23", CT200_ARGV, "/root/models/Qwen3-8B",
                       "/root/models/Qwen3-8B-DFlash", 1, ["container", "quadlet"]),
}
THIN_PREFIX = "tn"   # tn1..tnN; ct-names stay the full stand-in
PODMAN_PREFIX = "pd"  # pd1..pdN: the engine under `podman run`
QUADLET_PREFIX = "pq"  # pq1..pqN: the engine in a Quadlet unit

NAME = re.compile(r"^[a-z][a-z0-9-]{0,10}$")


def for_host(name: str) -> Profile:
    if not NAME.match(name):
        raise UserError(f"lab host name {name!r}: use lowercase letters, digits and '-', at most 11 characters")
    if re.fullmatch(THIN_PREFIX + r"\d+", name):
        return PROFILES["thin"]
    if re.fullmatch(PODMAN_PREFIX + r"\d+", name):
        return PROFILES["podman"]
    if re.fullmatch(QUADLET_PREFIX + r"\d+", name):
        return PROFILES["quadlet"]
    m = re.fullmatch(r"ct(\d+)", name)
    if m and int(m.group(1)) < 150:
        return PROFILES["ct129"]
    return PROFILES["ct150"] if m and int(m.group(1)) < 200 else PROFILES["ct200"]


def address(name: str, taken: set[str]) -> str:
    """ctN gets 10.200.0.N when 2 <= N <= 254 and free; other names the first free from .10."""
    m = re.fullmatch(r"ct(\d+)", name)
    if m and 2 <= int(m.group(1)) <= 254 and f"10.200.0.{int(m.group(1))}" not in taken:
        return f"10.200.0.{int(m.group(1))}"
    for n in range(10, 255):
        if f"10.200.0.{n}" not in taken:
            return f"10.200.0.{n}"
    raise UserError("the lab network 10.200.0.0/24 is full")


# What every lab unit shares: the start after the network, and how it stops and restarts.
_AFTER_NETWORK = """Documentation=https://docs.sglang.ai
After=network-online.target
Wants=network-online.target
"""
_SERVICE_TAIL = """KillSignal=SIGTERM
TimeoutStopSec=60
Restart=on-failure
RestartSec=5
LimitNOFILE=1048576

[Install]
WantedBy=multi-user.target
"""


def container_unit(exec_start: str) -> str:
    """A pd host's unit: a stale container removed first, `podman stop` with SGLang's drain time."""
    return f"""[Unit]
Description=SGLang server in a container (Qwen3-8B, DFlash)
{_AFTER_NETWORK}
[Service]
Type=simple
User=root
ExecStartPre=-{PODMAN} rm -f --ignore sglang
ExecStart={exec_start}
ExecStop={PODMAN} stop -t 50 sglang
{_SERVICE_TAIL}"""


def quadlet_text(p: Profile) -> str:
    """A pq host's .container: the pd host's container as Quadlet keys, the engine command in Exec=
    (quoted as an ExecStart= word: Quadlet splits Exec= by systemd's rules). The container keeps
    Quadlet's default name, systemd-%N (systemd-sglang-qwen)."""
    exec_words = " ".join(systemd_quote(w) for w in p.argv)
    return f"""# fleetspec lab: podman's Quadlet generator writes sglang-qwen.service from this file
[Unit]
Description=SGLang server in a Quadlet container (Qwen3-8B, DFlash)
Documentation=https://docs.sglang.ai
After=network-online.target
Wants=network-online.target

[Container]
Image={podman_image.image_name(p.version)}
Network=host
Volume=/root/models:/root/models:ro
Volume=/etc/fleetspec-lab:/etc/fleetspec-lab:ro
Environment=PYTHONUNBUFFERED=1
Exec={exec_words}
# Quadlet 5.4 has no Ipc= key (with one it writes no unit: "unsupported key 'Ipc'")
PodmanArgs=--ipc host
# lab only: the nspawn host's cgroups are read-only, so podman gets none; this comes after
# Quadlet's own --cgroups=split, and podman takes the last
PodmanArgs=--cgroups=disabled
# podman's stop: SGLang's SIGTERM drain, inside TimeoutStopSec
StopTimeout=50

[Service]
Restart=on-failure
RestartSec=5
TimeoutStopSec=60
# lab only: podman 4.3.1 keeps the cidfile after `podman rm --cidfile` (4.4 removes it with the
# container), and its `run --cidfile` refuses one that exists: "container id file exists"
ExecStartPre=-/usr/bin/rm -f %t/%N.cid

[Install]
WantedBy=multi-user.target
"""


def unit_text(p: Profile) -> str:
    """The unit as each fleet writes it: ct129's by hand (0.5.13 era), ct200's for 0.5.23."""
    exec_start = shlex.join(p.argv)
    if p.like in ("ct129", "ct150"):
        title = "Qwen3.6-27B (NEXTN)" if p.like == "ct129" else "Qwen3-8B (DFlash)"
        return f"""[Unit]
Description=SGLang {title}
After=network-online.target

[Service]
Type=simple
User=root
WorkingDirectory=/root
Environment=PYTHONUNBUFFERED=1
ExecStart={exec_start}
Restart=on-failure
RestartSec=5
LimitNOFILE=65535

[Install]
WantedBy=multi-user.target
"""
    if p.container:
        return container_unit(exec_start)
    thin = "Environment=FLEETSPEC_LAB_ENGINE=thin\n" if p.like == "thin" else ""
    return f"""[Unit]
Description=SGLang server (Qwen3-8B, DFlash)
{_AFTER_NETWORK}
[Service]
Type=simple
User=root
WorkingDirectory=/opt/sglang
Environment=PYTHONUNBUFFERED=1
Environment=SGLANG_PLUGINS=
{thin}ExecStart={exec_start}
{_SERVICE_TAIL}"""


def model_configs(p: Profile) -> dict[str, dict]:
    """config.json per model folder: realistic shapes, no weights."""
    if p.like == "ct129":
        layers = 64
        layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
        target = {
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": {
                "model_type": "qwen3_5_text", "hidden_size": 5120, "intermediate_size": 17408,
                "num_hidden_layers": layers, "num_attention_heads": 24, "num_key_value_heads": 4,
                "head_dim": 256, "layer_types": layer_types, "full_attention_interval": 4,
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_num_key_heads": 16, "linear_num_value_heads": 48, "mtp_num_hidden_layers": 1,
                "max_position_embeddings": 262144, "rope_theta": 10000000, "vocab_size": 248320,
                "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16",
            },
            "layer_types": layer_types, "num_hidden_layers": layers, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "5.8.1",
        }
        draft = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 5,
                 "hidden_size": 5120, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 128, "intermediate_size": 17408, "vocab_size": 248320,
                 "block_size": 16, "target_layer_ids": [1, 16, 31, 46, 61],
                 "dflash_config": {"mask_token_id": 248077, "target_model": "Qwen3.6-27B"},
                 "torch_dtype": "bfloat16"}
    else:
        target = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
                  "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
                  "rope_theta": 1000000, "rms_norm_eps": 1e-06, "vocab_size": 151936,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0"}
        draft = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 5,
                 "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "intermediate_size": 12288, "vocab_size": 151936, "block_size": 16,
                 "target_layer_ids": [1, 9, 17, 25, 33],
                 "dflash_config": {"mask_token_id": 151669, "target_model": "Qwen3-8B"},
                 "torch_dtype": "bfloat16"}
    return {p.model_path: target, p.draft_model_path: draft}


def inventory_vars(p: Profile) -> dict:
    return {"python": p.python, "service": SERVICE, "api_port": API_PORT, "model_path": p.model_path,
            "draft_model_path": p.draft_model_path, "gpu_count": p.gpu_count, "tags": list(p.tags),
            # The stand-in loads in ~10-20 s here; a hung start is found in two minutes, not fifteen.
            # The throughput gate's relaxations are named in docs/lab.md ("Gates on the lab"):
            # min_ratio 0.4 (on a 0.5.23 host DDTree builds no trees, so the release decodes as
            # the baseline does and the ratio is 1.0 plus the shared machine's noise, which swings
            # by up to 40% under a loaded CI; 0.4 still fails a really slower release, slow_tokens=4
            # measures ~0.25); at c=1 only and not at the serving concurrency (at
            # c=4 and above the stand-in's own CPU work per request-step, ~5-6 ms, outgrows its
            # paced step on the shared 2 cores, so those rounds measure the cores, not the
            # release), and 8 requests a round, not 16 (the stand-in paces its steps by a cost
            # model, so half the sample gives the same ratio in half the lab time).
            "extra": {"sglang_version": p.version, "lab_profile": p.like, "ready_timeout": 120,
                      "require_gpus": False,   # no GPU in a container; the engine is a stand-in
                      "gates": {"throughput": {"min_ratio": 0.4, "concurrency": [1], "requests": 8,
                                               "serving_concurrency": 0}}}}


def unit_path(p: Profile) -> str:
    """Where the host's service is written: a unit, or a pq host's Quadlet file."""
    if p.quadlet:
        return f"{quadlet.UNIT_DIR}/{SERVICE.removesuffix('.service')}.container"
    return f"/etc/systemd/system/{SERVICE}"


def files(p: Profile) -> dict[str, bytes]:
    """Host-specific files (absolute path -> bytes) laid into the host's overlay upper dir."""
    out = {unit_path(p): (quadlet_text(p) if p.quadlet else unit_text(p)).encode()}
    for folder, cfg in model_configs(p).items():
        out[f"{folder}/config.json"] = (json.dumps(cfg, indent=2) + "\n").encode()
        out[f"{folder}/README.lab"] = b"fleetspec lab: config only, no weights (the engine is a stand-in)\n"
    return out

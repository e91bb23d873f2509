"""End to end on real containers: the lab fleet boots, looks like the operators' hosts, serves
SGLang's API through the real parser, every fault produces the failure it names, and `lab down`
leaves nothing behind."""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest

from fleetspec.lab import profiles
from tests.lab.conftest import LAB_HOSTS

pytestmark = pytest.mark.lab

SERVICE = profiles.SERVICE
# The session's pair (ct129 and ct200 unless FLEETSPEC_LAB_HOSTS names others of the same shapes:
# a ct<150 host is like ct129, sglang 0.5.13.post1 with NEXTN; any other name like ct200).
A, B = LAB_HOSTS[0], LAB_HOSTS[1]


def http(fleet, host, path, body=None, timeout=60):
    """(status, body) of a request to the service on the host, made on the host (curl)."""
    cmd = ["curl", "-s", "-m", str(int(timeout)), "-o", "/tmp/fleetspec-lab-body", "-w", "%{http_code}"]
    if body is not None:
        cmd += ["-H", "content-type: application/json", "-d", json.dumps(body)]
    cmd.append(f"http://127.0.0.1:30000{path}")
    r = fleet.run(host, f"{shlex.join(cmd)}; echo; cat /tmp/fleetspec-lab-body", timeout=timeout + 10)
    code, _, text = r.stdout.decode().partition("\n")
    return int(code or 0), text


def wait_for(predicate, timeout, what):
    deadline, delay = time.monotonic() + timeout, 0.2
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_ready(fleet, host, timeout=120):
    return wait_for(lambda: http(fleet, host, "/ready")[0] == 200, timeout, f"{host} /ready")


def restart(fleet, host):
    assert fleet.run(host, f"systemctl restart {SERVICE}").returncode == 0


def generate(fleet, host, prompt="The capital of France is", n=32):
    code, text = http(fleet, host, "/generate",
                      {"text": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}})
    assert code == 200, text
    return json.loads(text)


def set_fault(fleet, host, *kinds):
    from fleetspec.lab import faults

    return faults.apply(fleet.root, host, kinds)


@pytest.fixture
def ct200_clean(lab_fleet):
    """ct200 ready before the test; faults cleared and the service healthy again after it. Most
    faults are read per request, so clearing them is enough: the engine is restarted only when
    the test left it stopped, crashed or hung (one engine load each, not one per test)."""
    from fleetspec.lab import faults

    wait_ready(lab_fleet, B)
    yield lab_fleet
    faults.clear(lab_fleet.root, B)
    if http(lab_fleet, B, "/health", timeout=5)[0] != 200 or http(lab_fleet, B, "/ready", timeout=5)[0] != 200:
        restart(lab_fleet, B)
        wait_ready(lab_fleet, B)


def test_hosts_answer_over_ssh(lab_fleet):
    for host in lab_fleet.addresses:
        r = lab_fleet.run(host, "hostname; systemctl is-system-running")
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().split() == [host, "running"]
    inv = lab_fleet.inventory.read_text()
    assert all(f"address: {address}" in inv for address in lab_fleet.addresses.values()), inv


def test_ct129_unit_has_the_operators_execstart(lab_fleet):
    r = lab_fleet.run(A, f"systemctl show -p ExecStart --value {SERVICE}")
    assert r.returncode == 0
    expected = " ".join(profiles.CT129_ARGV)
    assert f"argv[]={expected} ;" in r.stdout.decode()
    assert lab_fleet.run(A, f"systemctl is-enabled {SERVICE}").stdout.decode().strip() == "enabled"


def test_mixed_fleet_versions_and_models(lab_fleet):
    r129 = lab_fleet.run(A, "/root/ml-env/bin/python3 -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'; "
                                  "cat /root/models/Qwen3.6-27B/config.json; test -f /root/models/Qwen3.6-27B-DFlash/config.json")
    assert r129.returncode == 0, r129.stderr
    version, _, config = r129.stdout.decode().partition("\n")
    assert version == "0.5.13.post1"
    assert "linear_attention" in json.loads(config)["layer_types"]
    r200 = lab_fleet.run(B, "/opt/sglang/venv/bin/python3 -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'; "
                                  "test ! -e /root/ml-env && test -f /root/models/Qwen3-8B-DFlash/config.json")
    assert r200.returncode == 0 and r200.stdout.decode().strip() == "0.5.23"


def test_sglang_record_is_clean(lab_fleet):
    """The stand-in never touches sglang's files: every RECORD hash still matches the wheel."""
    script = r"""
import base64, hashlib, importlib.metadata as m
dist = m.distribution("sglang"); bad = []
for f in dist.files:
    if f.hash is None: continue
    data = f.locate().read_bytes()
    if base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest()).rstrip(b"=").decode() != f.hash.value:
        bad.append(str(f))
print(len(bad), bad[:3])
"""
    r = lab_fleet.run(B, f"/opt/sglang/venv/bin/python3 -c {shlex.quote(script)}")
    assert r.stdout.decode().startswith("0 "), r.stdout + r.stderr


@pytest.mark.parametrize("host,algorithm", [(A, "EAGLE"), (B, "DFLASH")])
def test_server_info_resolved_algorithm_and_launch_command(lab_fleet, host, algorithm):
    wait_ready(lab_fleet, host)
    code, text = http(lab_fleet, host, "/server_info")
    assert code == 200
    info = json.loads(text)
    assert info["speculative_algorithm"] == algorithm
    argv = profiles.for_host(host).argv
    assert info["launch_command"] == " ".join(argv[argv.index("sglang.launch_server") + 1:])
    assert "avg_spec_accept_length" in info["internal_states"][0]
    code, _ = http(lab_fleet, host, "/get_server_info")
    assert code == 200
    out = generate(lab_fleet, host)
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 32 and meta["spec_verify_ct"] >= 1
    assert meta["spec_accept_length"] > 1.0


def test_greedy_output_is_the_same_on_both_hosts(lab_fleet):
    for host in (A, B):
        wait_ready(lab_fleet, host)
    a, b = generate(lab_fleet, A), generate(lab_fleet, B)
    assert a["text"] == b["text"]
    # DFlash (ct200) accepts more per step than NEXTN (ct129)
    assert b["meta_info"]["spec_accept_length"] > a["meta_info"]["spec_accept_length"]


def test_unknown_flag_exits_2_with_the_real_parser(lab_fleet):
    r = lab_fleet.run(B, "/opt/sglang/venv/bin/python3 -m sglang.launch_server "
                               "--model-path /root/models/Qwen3-8B --no-such-flag 1", timeout=120)
    assert r.returncode == 2
    assert b"unrecognized arguments: --no-such-flag" in r.stderr


def test_fault_crash_at_start(ct200_clean):
    fleet = ct200_clean
    set_fault(fleet, B, "crash_at_start")
    restart(fleet, B)
    wait_for(lambda: fleet.run(B, f"systemctl show -p ExecMainStatus --value {SERVICE}")
             .stdout.decode().strip() == "1", 90, "the service to crash with status 1")
    assert http(fleet, B, "/health", timeout=5)[0] == 0  # nothing listening


def test_fault_hang_at_start(ct200_clean):
    fleet = ct200_clean
    set_fault(fleet, B, "hang_at_start")
    restart(fleet, B)
    wait_for(lambda: b"hang_at_start" in fleet.run(B, f"journalctl -u {SERVICE} -n 5 --no-pager").stdout,
             90, "the hang message")
    time.sleep(1.5)
    assert fleet.run(B, f"systemctl is-active {SERVICE}").stdout.decode().strip() == "active"
    assert http(fleet, B, "/health", timeout=5)[0] == 0


def test_fault_health_503_after(ct200_clean):
    fleet = ct200_clean
    assert http(fleet, B, "/health")[0] == 200
    set_fault(fleet, B, "health_503_after=0.5")     # 0.5 s after the engine came up: awaited, not slept
    wait_for(lambda: http(fleet, B, "/health")[0] == 503, 60, "/health to answer 503")
    assert http(fleet, B, "/health_generate")[0] == 503


def test_fault_wrong_algorithm(ct200_clean):
    fleet = ct200_clean
    set_fault(fleet, B, "wrong_algorithm=EAGLE")
    assert json.loads(http(fleet, B, "/server_info")[1])["speculative_algorithm"] == "EAGLE"


def test_fault_garbage_output(ct200_clean):
    fleet = ct200_clean
    good = generate(fleet, B)["text"]
    set_fault(fleet, B, "garbage_output")
    assert generate(fleet, B)["text"] != good


def test_fault_slow_tokens(ct200_clean):
    fleet = ct200_clean
    """Each step is paced 4x its modelled time: the request takes at least 4 x step_seconds per
    verify step (a lower bound that a loaded machine only exceeds; a ratio of two timings would
    shrink with the machine's own overhead)."""
    from fleetspec.lab.engine.fleetspec_lab_engine import settings

    engine = json.loads(fleet.run(B, "cat /etc/fleetspec-lab/engine.json 2>/dev/null || echo '{}'").stdout or b"{}")
    step = float({**settings.ENGINE_DEFAULTS, **engine}["step_seconds"])
    set_fault(fleet, B, "slow_tokens=4")
    slow = generate(fleet, B, n=48)["meta_info"]
    assert slow["e2e_latency"] >= 0.99 * 4 * step * slow["spec_verify_ct"], (slow, step)


def test_fault_slow_load(ct200_clean):
    fleet = ct200_clean
    set_fault(fleet, B, "slow_load=8")
    t0 = time.monotonic()
    restart(fleet, B)
    wait_ready(fleet, B)
    assert time.monotonic() - t0 >= 8


def test_fault_disk_full(ct200_clean):
    fleet = ct200_clean
    assert fleet.run(B, "mkdir -p /var/lib/fleetspec/keep && echo kept > /var/lib/fleetspec/keep/x").returncode == 0
    set_fault(fleet, B, "disk_full")
    r = fleet.run(B, "head -c 65536 /dev/zero > /var/lib/fleetspec/new")
    assert r.returncode != 0 and b"No space left on device" in r.stderr
    assert fleet.run(B, "cat /var/lib/fleetspec/keep/x").stdout == b"kept\n"
    from fleetspec.lab import faults

    faults.clear(fleet.root, B)
    assert fleet.run(B, "head -c 65536 /dev/zero > /var/lib/fleetspec/new && cat /var/lib/fleetspec/keep/x"
                     " && rm -rf /var/lib/fleetspec/new /var/lib/fleetspec/keep").stdout == b"kept\n"


def test_sigterm_drains_and_exits_0(ct200_clean):
    fleet = ct200_clean
    # A long request in flight while the service stops: it completes, and the exit status is 0.
    fleet.run(B, "rm -f /tmp/inflight; nohup curl -s -o /tmp/inflight -d '{\"text\":\"x\",\"sampling_params\":"
                       "{\"max_new_tokens\":300,\"temperature\":0}}' http://127.0.0.1:30000/generate "
                       ">/dev/null 2>&1 &")
    running = re.compile(r"^sglang:num_running_reqs\{[^}]*\} [1-9]", re.M)
    wait_for(lambda: running.search(http(fleet, B, "/metrics")[1]) or fleet.run(B, "test -s /tmp/inflight").returncode == 0,
             60, "the request to be running")
    assert fleet.run(B, f"systemctl stop {SERVICE}").returncode == 0
    meta = json.loads(fleet.run(B, "cat /tmp/inflight").stdout)["meta_info"]
    assert meta["completion_tokens"] == 300
    status = fleet.run(B, f"systemctl show -p ExecMainStatus,Result --value {SERVICE}").stdout.decode().split()
    assert sorted(status) == ["0", "success"]

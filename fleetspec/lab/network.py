"""The lab's private network: bridge fslab0 (10.200.0.1/24) and one namespace per host.

No default route and no NAT anywhere: the hosts reach each other and the machine, nothing else.
Names carry a fixed prefix so `lab down` can find what a crashed `lab up` left behind.
"""

from __future__ import annotations

import subprocess

BRIDGE = "fslab0"
BRIDGE_ADDR = "10.200.0.1/24"
NS_PREFIX = "fslab-"
VETH_PREFIX = "fsl-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def netns(name: str) -> str:
    return NS_PREFIX + name


def veth(name: str) -> str:
    return (VETH_PREFIX + name)[:15]


def ensure_bridge() -> None:
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", BRIDGE_ADDR, "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def add_host(name: str, address: str) -> None:
    """Namespace with lo up and eth0 (the far end of a veth on the bridge) at `address`/24."""
    ns, host_end = netns(name), veth(name)
    remove_host(name)
    _ip("netns", "add", ns)
    _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", host_end, "master", BRIDGE)
    _ip("link", "set", host_end, "up")
    _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "link", "set", "lo", "up")


def remove_host(name: str) -> None:
    _ip("link", "del", veth(name), check=False)
    if netns(name) in namespaces():
        _ip("netns", "del", netns(name), check=False)


def namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def lab_namespaces() -> list[str]:
    return [ns for ns in namespaces() if ns.startswith(NS_PREFIX)]


def remove_bridge() -> None:
    _ip("link", "del", BRIDGE, check=False)
    for link in _ip("-o", "link", "show", check=False).stdout.splitlines():
        dev = link.split(":")[1].strip().split("@")[0]
        if dev.startswith(VETH_PREFIX):
            _ip("link", "del", dev, check=False)


def bridge_exists() -> bool:
    return _ip("link", "show", BRIDGE, check=False).returncode == 0

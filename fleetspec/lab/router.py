"""The real sglang-router (from the offline wheel cache, as the unit tests install it) on the
controller's 127.0.0.1, in front of lab hosts' engines: for the lab tests and the bench."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from fleetspec.remote.router import RouterClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabRouter:
    def __init__(self, workers: list[str], log: Path):
        self.workers = list(workers)
        self.port, self.prometheus_port = free_port(), free_port()
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.client = RouterClient(f"http://127.0.0.1:{self.port}", name="lab router")

    @property
    def url(self) -> str:
        return self.client.base

    def start(self, timeout: float = 60.0) -> "LabRouter":
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
             "--prometheus-port", str(self.prometheus_port), "--health-check-interval-secs", "1",
             "--policy", "round_robin", "--worker-urls", *self.workers], stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + timeout
        while not self.all_healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sglang-router on {self.port} did not list {self.workers} healthy "
                                   f"(see {self.log})")
            time.sleep(0.2)
        return self

    def all_healthy(self) -> bool:
        try:
            return {w.url for w in self.client.workers() if w.healthy} >= set(self.workers)
        except Exception:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "LabRouter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def router_inventory(lab_inventory: Path, hosts: list[str], admin_url: str, name: str,
                     **router: object) -> Path:
    """A copy of the lab's inventory beside it (its key paths are relative) where `hosts` join
    router `front` at `admin_url`; the caller removes it."""
    import yaml

    data = yaml.safe_load(lab_inventory.read_text())
    data["routers"] = {"front": {"admin_url": admin_url, **router}}
    for h in hosts:
        data["hosts"][h].setdefault("vars", {})["router"] = "front"
    path = lab_inventory.parent / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path

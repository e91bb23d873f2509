"""Client CPU and wall time per remote command: paramiko (fleetspec's transport), OpenSSH with a
ControlMaster through a subprocess per command, and asyncssh, side by side.

A throwaway sshd on 127.0.0.1 (the tests' own, tests/conftest.py), one connection per client kept
for the whole run, --commands small commands each (`printf x`, as a ledger line or a fact is
small); interleaved rounds so load from elsewhere hits every client alike. Client CPU is the
controller side only: the fleetspec process's own CPU for paramiko and asyncssh (measured inside
the process, start-up excluded), the ssh processes' (master and one per command) for OpenSSH.

    python3 bench/ssh_overhead.py [--commands 200] [--rounds 3] [--asyncssh-python PATH]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ASYNCSSH = r"""
import asyncio, json, sys, time
import asyncssh
port, key, known, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
async def main():
    async with asyncssh.connect("127.0.0.1", port=port, username="root", client_keys=[key], known_hosts=known) as c:
        await c.run("true")
        c0, w0 = time.process_time(), time.monotonic()
        for _ in range(n):
            r = await c.run("printf x", check=True)
            assert r.stdout == "x"
        print(json.dumps({"cpu": time.process_time() - c0, "wall": time.monotonic() - w0}))
asyncio.run(main())
"""


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def paramiko_round(host, n: int, ciphers: tuple[str, ...] | None = None) -> dict:
    """ciphers: fleetspec's PREFERRED_CIPHERS for this round (None: as shipped; (): paramiko's own
    order, aes128-ctr with hmac-sha2-256)."""
    from fleetspec.remote import transport as tr

    saved = tr.PREFERRED_CIPHERS
    tr.PREFERRED_CIPHERS = saved if ciphers is None else ciphers
    t = tr.Transport(host)
    try:
        t.run_script("true", check=True)
        c0, w0 = time.process_time(), time.monotonic()
        for _ in range(n):
            assert t.run_script("printf x", check=True).stdout == "x"
        return {"cpu": time.process_time() - c0, "wall": time.monotonic() - w0}
    finally:
        tr.PREFERRED_CIPHERS = saved
        t.close()


def idle_round(host, connections: int, seconds: float, wake: float | None) -> float:
    """Client CPU ms per connection-second of `connections` open, quiet paramiko connections (a
    fleet waiting for its engines), with the reader's socket wake set to `wake` (None: fleetspec's
    READER_WAKE_S; 0.1 is paramiko's own)."""
    from fleetspec.remote import transport as tr

    saved = tr.READER_WAKE_S
    tr.READER_WAKE_S = saved if wake is None else wake
    ts = []
    try:
        for _ in range(connections):
            t = tr.Transport(host)
            t.run_script("true", check=True)
            ts.append(t)
        c0 = time.process_time()
        time.sleep(seconds)
        return (time.process_time() - c0) * 1000 / (connections * seconds)
    finally:
        tr.READER_WAKE_S = saved
        for t in ts:
            t.close()


def openssh_round(port: int, key: Path, known: Path, n: int, tmp: Path) -> dict:
    sock = tmp / "cm.sock"
    base = ["ssh", "-F", "/dev/null", "-i", str(key), "-o", f"UserKnownHostsFile={known}", "-o",
            "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", f"ControlPath={sock}", "-p", str(port)]
    c_start = children_cpu()
    master = subprocess.Popen([*base, "-M", "-N", "root@127.0.0.1"], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            if time.monotonic() > deadline or master.poll() is not None:
                raise SystemExit("the OpenSSH ControlMaster did not start")
            time.sleep(0.02)
        w0 = time.monotonic()
        for _ in range(n):
            r = subprocess.run([*base, "root@127.0.0.1", "printf x"], capture_output=True, text=True, check=True)
            assert r.stdout == "x"
        wall = time.monotonic() - w0
    finally:
        subprocess.run([*base, "-O", "exit", "root@127.0.0.1"], capture_output=True)
        master.wait(timeout=10)
    return {"cpu": children_cpu() - c_start, "wall": wall}   # includes the master's handshake: small


def asyncssh_round(python: str, port: int, key: Path, known: Path, n: int) -> dict:
    r = subprocess.run([python, "-c", ASYNCSSH, str(port), str(key), str(known), str(n)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"asyncssh run failed: {r.stderr[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commands", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-connections", type=int, default=10)
    ap.add_argument("--idle-seconds", type=float, default=5.0)
    ap.add_argument("--asyncssh-python", default=None, help="a python with asyncssh installed (skipped without)")
    args = ap.parse_args()
    from fleetspec.model.inventory import load_inventory
    from tests.conftest import Sshd, free_port, keygen, write_inventory

    with tempfile.TemporaryDirectory(prefix="fleetspec-ssh-bench-") as d:
        tmp = Path(d)
        key = keygen(tmp / "id_ed25519")
        server = Sshd(tmp / "sshd", free_port(), key).start()
        try:
            inv = write_inventory(tmp / "inv.yaml", {"h": server}, key)
            host = load_inventory(inv).hosts["h"]
            known = tmp / "known_hosts"
            rows: dict[str, list] = {"paramiko (fleetspec's transport, AES-GCM)": [],
                                     "paramiko, aes128-ctr + hmac-sha2-256 (paramiko's order)": [],
                                     "openssh": [], "asyncssh": []}
            gcm, ctr, *_ = rows
            idle: dict[str, list] = {"paramiko's 0.1 s": [], "fleetspec's READER_WAKE_S": []}
            for _ in range(args.rounds):
                idle["paramiko's 0.1 s"].append(idle_round(host, args.idle_connections, args.idle_seconds, 0.1))
                idle["fleetspec's READER_WAKE_S"].append(idle_round(host, args.idle_connections, args.idle_seconds, None))
                rows[gcm].append(paramiko_round(host, args.commands))
                rows[ctr].append(paramiko_round(host, args.commands, ciphers=()))
                rows["openssh"].append(openssh_round(server.port, key, known, args.commands, tmp))
                if args.asyncssh_python:
                    rows["asyncssh"].append(asyncssh_round(args.asyncssh_python, server.port, key, known, args.commands))
        finally:
            server.stop()
    n = args.commands
    print(f"{n} commands per round, median of {args.rounds} rounds, loopback sshd on this machine")
    print("| client | client CPU ms per command | wall ms per command |")
    print("|---|---|---|")
    for name, rs in rows.items():
        if rs:
            cpu = statistics.median(r["cpu"] for r in rs) / n * 1000
            wall = statistics.median(r["wall"] for r in rs) / n * 1000
            print(f"| {name} | {cpu:.2f} | {wall:.2f} |")
    print(f"\nQuiet connections ({args.idle_connections} open, {args.idle_seconds:g} s, median of {args.rounds}):")
    print("| paramiko reader wake | client CPU ms per connection-second |")
    print("|---|---|")
    for name, rs in idle.items():
        print(f"| {name} | {statistics.median(rs):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared pieces of the reliability suite (tests/lab/test_reliability*.py).

The suite drives real faults against the lab's second host pair (FLEETSPEC_LAB_HOSTS, e.g.
ct131 like ct129 and ct201 like ct200) through the real CLI, and checks the invariants byte for byte:
unit file sha256, `systemctl show -p ExecStart --value`, the drop-in folder, `current`, sglang's
files against pip's RECORD (status --json drift), the baseline's bytes, the ledger, the lock.

Every fault injected is counted in COUNTS; tests/lab/conftest.py prints the counts at the end of
the run (they are what tests/RELIABILITY.md quotes). Every fault is undone in a `finally`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import yaml

from tests.lab.conftest import FLEET_ROOT, ROOT  # the checkout; the fleet root the lab hosts belong to

SERVICE = "sglang-qwen.service"
UNIT = f"/etc/systemd/system/{SERVICE}"
DROPIN_DIR = f"/etc/systemd/system/{SERVICE}.d"
STATE = "/var/lib/fleetspec/sglang-qwen"
SITE = {"0.5.13.post1": "/root/ml-env/lib/python3.11/site-packages",
        "0.5.23": "/opt/sglang/venv/lib/python3.11/site-packages"}

COUNTS: Counter = Counter()      # faults injected, crash points, bad-input cases, invariant checks …


def count(what: str, n: int = 1) -> None:
    COUNTS[what] += n


def record_max(what: str, value: int) -> None:
    """A figure where the worst case is what matters (printed with the counts)."""
    COUNTS[what] = max(COUNTS[what], value)


# The CLI, as an operator runs it ----------------------------------------------------------------
def fs(root, *args, timeout=900, env=None, check_rc=None, input=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fleetspec", "--root", str(root), *args]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("FLEETSPEC_PAUSE_AT", None)
    if env and "FLEETSPEC_PAUSE_AT" in env:
        full_env["FLEETSPEC_PAUSE_AT"] = env["FLEETSPEC_PAUSE_AT"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                       input=input, stdin=None if input is not None else subprocess.DEVNULL)
    if check_rc is not None:
        assert r.returncode == check_rc, f"{' '.join(args)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def start_paused(root, host, step, *args, env=None) -> subprocess.Popen:
    """Start `deploy HOST --algo …` that stops itself (SIGSTOP) right before `step`."""
    cmd = [sys.executable, "-m", "fleetspec", "--root", str(root), "deploy", host, "--yes", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {}), "FLEETSPEC_PAUSE_AT": step})
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(f"FLEETSPEC-PAUSED {step} "):
            proc.seen = seen
            _wait_stopped(proc.pid)
            return proc
    proc.wait(timeout=30)
    raise AssertionError(f"deploy never reached {step} (exit {proc.returncode}):\n" + "".join(seen))


def _wait_stopped(pid: int, timeout: float = 30) -> None:
    """The deploy prints its pause line and only then stops itself: a SIGCONT sent in between is
    lost and leaves it stopped for good. Wait until the kernel shows it stopped (state T)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] in "Tt":
            return
        time.sleep(0.01)
    raise AssertionError(f"deploy pid {pid} announced its pause but never stopped")


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL a process this suite started (by its pid), and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    count("faults: SIGKILL of fleetspec")


def collect(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Wait for a running deploy and return (rc, all its output). One still running after
    `timeout` s is stuck: its threads' stacks (fleetspec dumps them on SIGUSR1) are taken, it is
    killed, and the test fails showing where it waited."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1.0)
        kill(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"deploy still running after {timeout:g}s; its stacks:\n"
                             + "".join(getattr(proc, "seen", [])) + (out or "")) from None
    return proc.returncode, "".join(getattr(proc, "seen", [])) + (out or "")


def finish(proc: subprocess.Popen, timeout=600) -> tuple[int, str]:
    """SIGCONT a paused deploy and collect the rest of its output."""
    os.kill(proc.pid, signal.SIGCONT)
    return collect(proc, timeout)


# A fleet root of our own (temp folder) ---------------------------------------------------------
def make_root(path: Path, hosts, *, playbooks: dict | None = None, inventory_vars: dict | None = None,
              templates: dict | None = None, host_overrides: dict | None = None,
              defaults: dict | None = None) -> Path:
    """A fleet root for `hosts` of the lab: the real playbooks/templates (linked), the lab's inventory
    entries for those hosts with absolute key paths; `playbooks` maps a file name to a function that
    edits its parsed YAML (or to YAML text); `templates` maps a template name to replacement text."""
    path.mkdir(parents=True, exist_ok=True)
    lab = yaml.safe_load((FLEET_ROOT / "inventory" / "lab.yaml").read_text())
    inv = {"defaults": dict(lab["defaults"]), "groups": {"rel": list(hosts)}, "hosts": {}}
    inv["defaults"]["ssh_key"] = str(FLEET_ROOT / ".lab" / "ssh" / "id_ed25519")
    inv["defaults"]["known_hosts"] = str(FLEET_ROOT / ".lab" / "ssh" / "known_hosts")
    inv["defaults"].update(defaults or {})
    for h in hosts:
        entry = json.loads(json.dumps(lab["hosts"][h]))
        entry["vars"].update((inventory_vars or {}).get(h, {}))
        entry.update((host_overrides or {}).get(h, {}))
        inv["hosts"][h] = entry
    (path / "inventory").mkdir(exist_ok=True)
    (path / "inventory" / "lab.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))
    pb = path / "playbooks"
    pb.mkdir(exist_ok=True)
    for item in (ROOT / "playbooks").iterdir():
        dest = pb / item.name
        if dest.exists() or dest.is_symlink():
            continue
        if item.suffix == ".yaml" and playbooks and item.name in playbooks:
            edit = playbooks[item.name]
            if isinstance(edit, str):
                dest.write_text(edit)
            else:
                data = yaml.safe_load(item.read_text())
                dest.write_text(yaml.safe_dump(edit(data) or data, sort_keys=False))
        elif item.suffix == ".yaml":
            dest.write_text(item.read_text())
        else:
            dest.symlink_to(item)
    for name, text in (playbooks or {}).items():
        if not (pb / name).exists() and isinstance(text, str):
            (pb / name).write_text(text)
    tp = path / "templates"
    tp.mkdir(exist_ok=True)
    for item in (ROOT / "templates").iterdir():
        dest = tp / item.name
        if not dest.exists():
            dest.write_text((templates or {}).get(item.name, item.read_text()))
    return path


def quick_smoke(data: dict) -> dict:
    """The sweep's playbook edit: smoke = the import test only (the smoke's content is not what a
    crash sweep tests; the full smoke runs in test_deploy.py and in the reliability deploys)."""
    data["smoke"] = {"imports": ["sglang.srt.speculative.ddtree_utils"]}
    return data


# Looking at a host ----------------------------------------------------------------------------
class Lab:
    def __init__(self, fleet):
        self.fleet = fleet

    def sh(self, host, script, timeout=120, ok=True) -> str:
        r = self.fleet.run(host, script, timeout=timeout)
        if ok:
            assert r.returncode == 0, (host, script, r.stdout, r.stderr)
        return r.stdout.decode(errors="replace")

    def rc(self, host, script, timeout=120) -> int:
        return self.fleet.run(host, script, timeout=timeout).returncode

    def snapshot(self, host) -> dict:
        """Invariant 1, byte for byte: unit sha256, ExecStart as systemd holds it, drop-in folder
        listing (with each drop-in's sha256), `current`."""
        q = shlex.quote
        out = self.sh(host, f"sha256sum {UNIT}; echo ---; systemctl show -p ExecStart --value {SERVICE}; echo ---; "
                            f"ls -A {DROPIN_DIR} 2>/dev/null; echo ---; "
                            f"(cd {DROPIN_DIR} 2>/dev/null && sha256sum -- * 2>/dev/null) || true; echo ---; "
                            f"readlink {q(STATE + '/current')} || true")
        unit, execstart, dropins, dropin_sums, current = out.split("---\n")
        count("invariant checks")
        return {"unit": unit.split()[0], "execstart": _argv_of(execstart), "dropins": dropins.split(),
                "dropin_sha256": dropin_sums.split(), "current": current.strip()}

    def main_pid(self, host) -> str:
        return self.sh(host, f"systemctl show -p MainPID,InvocationID --value {SERVICE}").strip()

    def baseline_sha(self, host) -> str:
        """Hashes of the recorded baseline (invariant 2: never lost or changed by a deploy)."""
        return self.sh(host, f"cd {STATE}/baseline && find . -type f -print0 | sort -z | xargs -0 sha256sum")

    def ledger(self, host) -> list[dict]:
        text = self.sh(host, f"cat {STATE}/ledger.jsonl 2>/dev/null || true")
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:          # a torn line (the torn-line test makes one on purpose)
                continue
        return out

    def lock_free(self, host, wait=20.0) -> bool:
        """The lock is free (a dead holder's link closed, the kernel let it go)."""
        deadline = time.monotonic() + wait
        while True:
            if self.rc(host, f"[ ! -e {STATE}/lock ] || flock -n {STATE}/lock true") == 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    def tree_hash(self, host, *paths) -> str:
        """Every entry under `paths` (type, mode, owner, size, mtime, link target) and the sha256
        of every regular file, as one digest; releases' overlay symlink farms (thousands of links
        built from the patch set, checked by status's drift and the stage's hashes) are left out."""
        q = " ".join(shlex.quote(p) for p in paths)
        return self.sh(host, f"{{ find {q} -path '*/overlay' -prune -o -printf '%y %m %u %s %T@ %p -> %l\\n' "
                             f"2>/dev/null | sort; "
                             f"find {q} -path '*/overlay' -prune -o -type f -print0 2>/dev/null | sort -z | "
                             f"xargs -0 -r sha256sum; }} | sha256sum").split()[0]


def _argv_of(show: str) -> str:
    """The argv[] part of `systemctl show -p ExecStart --value` (pids and times stripped)."""
    if "argv[]=" not in show:
        return show.strip()
    return show.split("argv[]=", 1)[1].split(" ; ignore_errors=")[0].strip()


def status(root, host) -> dict:
    """The host's status row (its exit code checked against it: labtools.status_rows)."""
    from tests.lab.labtools import status_rows

    return status_rows(fs(root, "status", host, "--json", timeout=120))[-1]


def wait_healthy(root, host, deadline=180) -> dict:
    end = time.monotonic() + deadline
    s = {}
    while time.monotonic() < end:
        s = status(root, host)
        if s["health"] == "ok" and s["state"] == "active/running":
            return s
        time.sleep(1.5)
    raise AssertionError(f"{host} not healthy after {deadline}s: {s}")


# Faults -----------------------------------------------------------------------------------------
def veth(host: str) -> str:
    from fleetspec.lab import network

    return network.veth(host)


@contextmanager
def link_down(host: str):
    """Cut the lab host's link (its veth on the bridge); always restored."""
    dev = veth(host)
    subprocess.run(["ip", "link", "set", dev, "down"], check=True)
    count("faults: link cut")
    try:
        yield dev
    finally:
        subprocess.run(["ip", "link", "set", dev, "up"], check=True)
        _wait_reachable(host)


def _wait_reachable(host: str, within: float = 30.0) -> None:
    """After the link comes back, the bridge port and the neighbour entry (failed while the link
    was down: "No route to host") take a moment; the test's next look waits for sshd to answer."""
    import socket

    address = yaml.safe_load((FLEET_ROOT / "inventory" / "lab.yaml").read_text())["hosts"][host]["address"]
    deadline = time.monotonic() + within
    while True:
        try:
            with socket.create_connection((address, 22), timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextmanager
def slow_link(host: str, rate: str = "256kbit"):
    """A token-bucket rate limit on the root side of the host's veth (our uploads to it crawl);
    always removed."""
    dev = veth(host)
    subprocess.run(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "16kbit",
                    "latency", "2s"], check=True)
    count("faults: slow link")
    try:
        yield dev
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)


def lab_fault(host, *specs):
    fs(FLEET_ROOT, "lab", "fault", host, *specs, check_rc=0, timeout=120)
    count("faults: lab fault " + specs[0].split("=")[0])


def clear_faults(host):
    fs(FLEET_ROOT, "lab", "fault", host, "--clear", check_rc=0, timeout=120)


# The session's view of the two hosts -----------------------------------------------------------
EXPECTED_ALGO = {0: ("NEXTN", "EAGLE"), 1: ("DFLASH", "DFLASH")}   # (as written, as served) per host slot


class Rel:
    """The reliability suite's fleet: its own fleet root (quick smoke, 30 s command timeout), the
    two lab hosts, and each host's pristine state as first seen (what every test must end on)."""

    def __init__(self, fleet, root: Path):
        self.fleet, self.root, self.lab = fleet, root, Lab(fleet)
        self.h1, self.h2 = fleet.hosts[0], fleet.hosts[1]
        self.pristine: dict[str, dict] = {}
        self.baselines: dict[str, str] = {}
        self.torn: dict[str, int] = {}

    def expected(self, host) -> tuple[str, str]:
        return EXPECTED_ALGO[self.fleet.hosts.index(host)]

    def ensure_baseline(self, host) -> dict:
        """Faults cleared, the host back on its baseline (rollback if needed), healthy; its snapshot."""
        clear_faults(host)
        s = status(self.root, host)
        if s["release"] or any("interrupted" in n or "stale lock" in n for n in s["notes"]):
            fs(self.root, "rollback", host, check_rc=0)
        return self.assert_on_baseline(host)

    def assert_on_baseline(self, host, *, notes_ok=False) -> dict:
        s = wait_healthy(self.root, host)
        snap = self.lab.snapshot(host)
        written, served = self.expected(host)
        assert (s["algo"], s["served_algo"], s["drift"]) == (written, served, "pristine"), s
        unfinished = [n for n in s["notes"] if "before switching (host unchanged)" not in n]
        assert s["release"] is None and (notes_ok or not unfinished), s
        if host not in self.pristine:
            assert snap["dropins"] == [] and snap["current"] == "", snap
            self.pristine[host] = snap
            self.torn[host] = self.torn_lines(host)     # left by earlier sessions' torn-line tests
        assert snap == self.pristine[host], (snap, self.pristine[host])
        self.check_baseline_kept(host)
        assert self.lab.lock_free(host, wait=0), "the lock is still held"
        return snap

    def check_baseline_kept(self, host) -> None:
        """Invariant 2: once recorded, the baseline's files never change (only --retake may)."""
        has = self.lab.rc(host, f"test -f {STATE}/baseline/baseline.json") == 0
        now = self.lab.baseline_sha(host) if has else ""
        if not self.baselines.get(host):
            self.baselines[host] = now
        else:
            assert now == self.baselines[host], f"the baseline of {host} changed or vanished"

    def torn_lines(self, host) -> int:
        r = fs(self.root, "history", host, "--json", check_rc=0)
        assert "Traceback" not in r.stderr, r.stderr
        m = re.search(r"skipped (\d+) torn ledger line", r.stderr)
        return int(m.group(1)) if m else 0

    def note_torn(self, host, history_stderr: str) -> None:
        """A test that tore a ledger line on purpose (or by ENOSPC) says how many there are now."""
        m = re.search(r"skipped (\d+) torn ledger line", history_stderr)
        self.torn[host] = int(m.group(1)) if m else 0

    def history_clean(self, host) -> None:
        """Invariant 2: the ledger parses whole but for the torn lines tests made on purpose, and
        `history` reads it without a crash."""
        self.torn.setdefault(host, 0)
        assert self.torn_lines(host) == self.torn[host]


_REL: list[Rel] = []


def rel_fixture(lab_fleet, tmp_path_factory) -> Rel:
    """One Rel for the whole session, whichever module asks first."""
    if not _REL:
        root = make_root(tmp_path_factory.mktemp("relroot"), lab_fleet.hosts,
                         playbooks={"ddtree.yaml": quick_smoke}, defaults={"command_timeout": 30})
        _REL.append(Rel(lab_fleet, root))
    return _REL[0]

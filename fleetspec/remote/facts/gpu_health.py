"""GPU health in one command: nvidia-smi's GPU, remapped-row and compute-app queries, the owner of
every process holding GPU memory, and the Xid lines of the kernel log since boot.

Every part is a section of the output, framed by a marker line, with its exit status, so one
part that fails (a GPU too old for row remapping, a kernel log that cannot be read) is said and
the rest is still read. Field names and formats are nvidia-smi's (`nvidia-smi --help-query-gpu`,
`--help-query-remapped-rows`, `--help-query-compute-apps`); `clocks_event_reasons` was named
`clocks_throttle_reasons` before driver r535, so the query is asked again with the old name.
"""

from __future__ import annotations

import csv
import io
import re
import shlex
from dataclasses import dataclass, field

QUERY_GPU = ("index,uuid,pci.bus_id,name,driver_version,memory.total,memory.used,"
             "ecc.errors.uncorrected.volatile.total,retired_pages.pending,clocks_event_reasons.active")
QUERY_GPU_OLD = QUERY_GPU.replace("clocks_event_reasons", "clocks_throttle_reasons")
QUERY_REMAP = "gpu_bus_id,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure"
# gpu_bus_id first, so each process is charged to its GPU (the fields after it are the ones asked for)
QUERY_APPS = "gpu_bus_id,pid,used_memory"
FORMAT = "--format=csv,noheader,nounits"
MARK = "__FLEETSPEC_GPU__"
NO_SMI = "__FLEETSPEC_NO_NVIDIA_SMI__"
XID_GREP = "NVRM: Xid"


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    bus_id: str                       # as nvidia-smi prints it: 00000000:19:00.0
    name: str
    driver: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    ecc_uncorrected: int | None       # volatile (since the driver loaded); None: ECC off or not supported
    retired_pending: bool | None      # a page retirement waits for the next driver reload
    clock_event_reasons: str | None   # bit mask, 0x0000000000000000 when nothing holds the clocks down

    @property
    def pci(self) -> str:
        return pci_key(self.bus_id)


@dataclass(frozen=True)
class RemapState:
    bus_id: str
    uncorrectable: int | None         # rows remapped for uncorrectable errors
    pending: bool | None              # a remap waits for the next GPU reset
    failure: bool | None              # a remap failed: the GPU must be replaced

    @property
    def pci(self) -> str:
        return pci_key(self.bus_id)


@dataclass(frozen=True)
class ComputeApp:
    bus_id: str
    pid: int
    used_mib: int | None
    name: str | None                  # /proc/<pid>/comm
    cgroup: str | None                # its cgroup path (v2, else the systemd hierarchy's)

    @property
    def pci(self) -> str:
        return pci_key(self.bus_id)


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str                          # the PCI address the kernel names: 0000:19:00
    at: float | None                  # epoch seconds (journal) or boot time + uptime (dmesg)
    text: str                         # the line's message, from NVRM on


@dataclass
class GpuHealth:
    present: bool                     # False: no nvidia-smi on the host
    gpus: list[GpuState] = field(default_factory=list)
    remapped: list[RemapState] = field(default_factory=list)
    apps: list[ComputeApp] = field(default_factory=list)
    xids: list[XidEvent] = field(default_factory=list)
    unit_cgroup: str | None = None    # the service's ControlGroup; its processes are the unit's own
    kernel_log: str = "none"          # journal | dmesg | none (not readable: Xids unknown)
    now: float | None = None          # the host's clock when read
    boot: float | None = None         # the host's boot time (epoch seconds)
    unread: list[str] = field(default_factory=list)   # parts nvidia-smi could not answer, one line each

    def index_of(self, pci: str) -> int | None:
        for gpu in self.gpus:
            if gpu.pci == pci:
                return gpu.index
        return None

    def owned(self, app: ComputeApp) -> bool:
        """The process runs in the unit's cgroup (or one below it)."""
        if not self.unit_cgroup or self.unit_cgroup in ("/", "") or not app.cgroup:
            return False
        base = self.unit_cgroup.rstrip("/")
        return app.cgroup == base or app.cgroup.startswith(base + "/")


def pci_key(bus_id: str) -> str:
    """domain:bus:device in lower case, the form both nvidia-smi (00000000:19:00.0) and the
    kernel's Xid lines (PCI:0000:19:00) reduce to."""
    text = bus_id.strip().lower().removeprefix("pci:")
    parts = text.split(":")
    if len(parts) == 3:
        domain, bus, dev = parts
    elif len(parts) == 2:
        domain, (bus, dev) = "0", parts
    else:
        return text
    return f"{int(domain or '0', 16):04x}:{bus.zfill(2)}:{dev.split('.')[0].zfill(2)}"


def command(service: str = "") -> str:
    """POSIX sh; each section starts with `MARK <name>` and ends with `MARK rc <status>`."""
    m = shlex.quote(MARK)
    smi = "nvidia-smi"
    unit = shlex.quote(service) if service else "''"
    return "\n".join([
        f"command -v {smi} >/dev/null 2>&1 || {{ echo {NO_SMI}; exit 0; }}",
        f"echo {m} clock; date +%s; awk '/^btime/ {{print $2}}' /proc/stat",
        f"_o=$({smi} --query-gpu={QUERY_GPU} {FORMAT} 2>&1); _r=$?",
        f"if [ $_r -ne 0 ]; then _o=$({smi} --query-gpu={QUERY_GPU_OLD} {FORMAT} 2>&1); _r=$?; fi",
        f"echo {m} gpus; printf '%s\\n' \"$_o\"; echo {m} rc $_r",
        f"echo {m} remap; {smi} --query-remapped-rows={QUERY_REMAP} {FORMAT} 2>&1; echo {m} rc $?",
        f"_a=$({smi} --query-compute-apps={QUERY_APPS} {FORMAT} 2>&1); _r=$?",
        f"echo {m} apps; printf '%s\\n' \"$_a\"; echo {m} rc $_r",
        f"echo {m} owners",
        "printf '%s\\n' \"$_a\" | while IFS=', ' read -r _bus _pid _mem; do",
        "  case $_pid in ''|*[!0-9]*) continue;; esac",
        "  _cg=$(sed -n 's/^0:://p' /proc/$_pid/cgroup 2>/dev/null | head -n 1)",
        "  [ -n \"$_cg\" ] || _cg=$(sed -n 's/^[0-9]*:name=systemd://p' /proc/$_pid/cgroup 2>/dev/null | head -n 1)",
        "  printf '%s\\t%s\\t%s\\n' \"$_pid\" \"${_cg:--}\" \"$(cat /proc/$_pid/comm 2>/dev/null || echo -)\"",
        "done",
        f"echo {m} unit; [ -z {unit} ] || systemctl show -p ControlGroup --value {unit} 2>/dev/null; echo {m} rc 0",
        f"echo {m} xid",
        "if command -v journalctl >/dev/null 2>&1 && journalctl -k -b 0 -n 0 -q --no-pager >/dev/null 2>&1; then",
        f"  echo journal; journalctl -k -b 0 -o short-unix -q --no-pager 2>/dev/null | grep -F {shlex.quote(XID_GREP)}"
        " | tail -n 500",
        "elif dmesg >/dev/null 2>&1; then",
        f"  echo dmesg; dmesg 2>/dev/null | grep -F {shlex.quote(XID_GREP)} | tail -n 500",
        "else echo none; fi",
        f"echo {m} rc 0",
    ])


def _sections(stdout: str) -> dict[str, tuple[list[str], int]]:
    out: dict[str, tuple[list[str], int]] = {}
    name: str | None = None
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(MARK + " "):
            word = line[len(MARK) + 1:].split()
            if word and word[0] == "rc" and name is not None:
                out[name] = (lines, int(word[1]) if len(word) > 1 and word[1].lstrip("-").isdigit() else -1)
                name, lines = None, []
            elif word:
                if name is not None:            # a section without its rc line (clock has none)
                    out[name] = (lines, 0)
                name, lines = word[0], []
            continue
        if name is not None:
            lines.append(line)
    if name is not None:
        out[name] = (lines, 0)
    return out


def _missing(text: str) -> bool:
    text = text.strip()
    return not text or text.startswith("[") or text == "N/A"


def _int(text: str) -> int | None:
    return None if _missing(text) else int(float(text.strip()))


def _flag(text: str) -> bool | None:
    """Yes/No (and 0/1, which some drivers print for remapped_rows.pending/failure)."""
    text = text.strip().lower()
    if _missing(text):
        return None
    if text in ("yes", "1", "true"):
        return True
    if text in ("no", "0", "false"):
        return False
    raise ValueError(f"expected Yes or No, got {text!r}")


def _rows(lines: list[str], width: int, what: str) -> list[list[str]]:
    rows = []
    for row in csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        if "no running" in row[0].lower():      # "No running processes found" (some drivers print it)
            continue
        if len(row) != width:
            raise ValueError(f"{what}: expected {width} CSV fields, got {len(row)}: {row!r}")
        rows.append([c.strip() for c in row])
    return rows


def _unread(what: str, lines: list[str], rc: int) -> str:
    detail = next((ln.strip() for ln in reversed(lines) if ln.strip()), f"exit {rc}")
    return f"nvidia-smi {what}: {detail[:200]}"


# NVRM: Xid (PCI:0000:19:00): 79, pid=..., GPU has fallen off the bus.  (also "Xid (0000:19:00)")
XID = r"(?P<xid>NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)[^)]*\): (?P<code>\d+))"
# Only where the kernel's own message starts: right after dmesg's `[uptime]` (and a CONFIG_PRINTK_CALLER
# `[T123]`), or after journalctl -o short-unix's `<epoch> <host> kernel: `. Anywhere else on a line it
# is text a user put there: a segfault report prints the mapped file's name as it is
# (`python3[9]: segfault at 0 ip … in NVRM: Xid (PCI:…): 79, x[7f…+1000]`), and any local user can
# name a file so and crash a program in it.
DMESG_XID = re.compile(r"^\[\s*(?P<up>\d+(?:\.\d+)?)\](?:\s*\[\s*[CT]\d+\])?\s*" + XID)
JOURNAL_XID = re.compile(r"^(?P<t>\d+(?:\.\d+)?)\s+(?:\S+\s+kernel:\s+)?" + XID)


def parse_xids(lines: list[str], source: str, boot: float | None) -> list[XidEvent]:
    """Xid events from kernel log lines: `journalctl -o short-unix` (epoch first) or `dmesg`
    ([seconds since boot] first)."""
    out = []
    for line in lines:
        found = (JOURNAL_XID if source == "journal" else DMESG_XID).match(line)
        if not found:
            continue
        if source == "journal":
            at: float | None = float(found.group("t"))
        else:
            at = boot + float(found.group("up")) if boot is not None else None
        out.append(XidEvent(int(found.group("code")), pci_key(found.group("pci")), at, line[found.start("xid"):].strip()))
    return out


def parse(stdout: str, service: str = "") -> GpuHealth:
    if stdout.strip() == NO_SMI:
        return GpuHealth(present=False)
    parts = _sections(stdout)
    if "gpus" not in parts:
        raise ValueError("no GPU section in the output")
    health = GpuHealth(present=True)
    clock = [ln.strip() for ln in parts.get("clock", ([], 0))[0] if ln.strip()]
    health.now = float(clock[0]) if clock and clock[0].isdigit() else None
    health.boot = float(clock[1]) if len(clock) > 1 and clock[1].isdigit() else None
    lines, rc = parts["gpus"]
    if rc != 0:
        raise ValueError(_unread("--query-gpu", lines, rc))
    for row in _rows(lines, 10, "--query-gpu"):
        index, uuid, bus, name, driver, total, used, ecc, pending, reasons = row
        health.gpus.append(GpuState(int(index), uuid, bus, name, driver, _int(total), _int(used), _int(ecc),
                                    _flag(pending), None if _missing(reasons) else reasons))
    lines, rc = parts.get("remap", ([], -1))
    if rc == 0:
        for bus, uncorrectable, pending, failure in _rows(lines, 4, "--query-remapped-rows"):
            health.remapped.append(RemapState(bus, _int(uncorrectable), _flag(pending), _flag(failure)))
    else:
        health.unread.append(_unread("--query-remapped-rows", lines, rc))
    lines, rc = parts.get("apps", ([], -1))
    owners: dict[int, tuple[str | None, str | None]] = {}
    for line in parts.get("owners", ([], 0))[0]:
        pid, _, rest = line.partition("\t")
        group, _, comm = rest.partition("\t")
        if pid.isdigit():
            owners[int(pid)] = (None if group in ("", "-") else group, None if comm in ("", "-") else comm)
    if rc == 0:
        for bus, pid, used in _rows(lines, 3, "--query-compute-apps"):
            group_of, name_of = owners.get(int(pid), (None, None))
            health.apps.append(ComputeApp(bus, int(pid), _int(used), name_of, group_of))
    else:
        health.unread.append(_unread("--query-compute-apps", lines, rc))
    unit = [ln.strip() for ln in parts.get("unit", ([], 0))[0] if ln.strip()]
    health.unit_cgroup = unit[0] if unit else None
    lines = parts.get("xid", (["none"], 0))[0]
    source = lines[0].strip() if lines else "none"
    health.kernel_log = source if source in ("journal", "dmesg") else "none"
    health.xids = parse_xids(lines[1:], health.kernel_log, health.boot)
    return health

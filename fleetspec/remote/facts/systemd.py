"""A service's state and command line, from `systemctl show` (systemd 252's output format).

systemctl prints each Exec* command as `{ path=… ; argv[]=… ; ignore_errors=no ; start_time=[…] ;
stop_time=[…] ; pid=N ; code=… ; status=… }` with argv[] joined by plain spaces (systemctl-show.c:
`strv_join(info.argv, " ")`, no quoting), so `argv` here is exact only when no word holds a space;
fleetspec.systemd_unit reads the unit files for the exact words. String-list properties (DropInPaths,
Environment) are printed word by word, quoted as a shell would where needed (shell_maybe_quote).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

PROPERTIES = ("ActiveState", "SubState", "MainPID", "FragmentPath", "DropInPaths", "ExecStart",
              "Environment", "NRestarts", "Result", "LoadState", "UnitFileState", "SourcePath",
              "NeedDaemonReload")
NO_SYSTEMCTL = "__FLEETSPEC_NO_SYSTEMCTL__"

_EXEC = re.compile(
    r"^\{ path=(?P<path>.*?) ; argv\[\]=(?P<argv>.*) ; ignore_errors=(?P<ignore>yes|no) ; "
    r"start_time=\[(?P<start>[^\]]*)\] ; stop_time=\[(?P<stop>[^\]]*)\] ; pid=(?P<pid>\d+) ; "
    r"code=(?P<code>\S+) ; status=(?P<status>\S*) \}$", re.DOTALL)


@dataclass(frozen=True)
class ExecInfo:
    path: str
    argv: tuple[str, ...]
    ignore_errors: bool
    pid: int
    code: str
    status: str
    start_time: str | None = None
    stop_time: str | None = None


@dataclass
class SystemdUnit:
    unit: str
    available: bool = True            # False when the host has no systemctl
    load_state: str | None = None
    active_state: str | None = None
    sub_state: str | None = None
    main_pid: int | None = None
    fragment_path: str | None = None
    dropin_paths: list[str] = field(default_factory=list)
    exec_start: list[ExecInfo] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    n_restarts: int | None = None
    result: str | None = None
    unit_file_state: str | None = None
    source_path: str | None = None    # what a generator made the unit from (a Quadlet .container)
    need_daemon_reload: bool = False  # a unit file or its source changed on disk since systemd loaded it
    raw: dict[str, list[str]] = field(default_factory=dict, repr=False)

    @property
    def argv(self) -> list[str] | None:
        """The first ExecStart's argv as systemctl shows it (see module docstring)."""
        return list(self.exec_start[0].argv) if self.exec_start else None

    @property
    def found(self) -> bool:
        return self.available and self.load_state == "loaded"


def command(service: str) -> str:
    unit = shlex.quote(service)
    return (f"command -v systemctl >/dev/null 2>&1 || {{ echo {NO_SYSTEMCTL}; exit 0; }}; "
            f"systemctl show -p {','.join(PROPERTIES)} -- {unit}")


def parse_exec(value: str) -> ExecInfo:
    m = _EXEC.match(value.strip(" \n"))
    if not m:
        raise ValueError(f"not an Exec* value: {value[:80]!r}")
    argv = tuple(m["argv"].split(" ")) if m["argv"] else ()
    return ExecInfo(path=m["path"], argv=argv, ignore_errors=m["ignore"] == "yes", pid=int(m["pid"]),
                    code=m["code"], status=m["status"], start_time=_na(m["start"]), stop_time=_na(m["stop"]))


def _na(value: str) -> str | None:
    return None if value in ("n/a", "") else value


_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
        "\\": "\\", '"': '"', "'": "'", "`": "`", "$": "$"}


def split_words(value: str) -> list[str]:
    """Words of a string-list property: plain, or "double quoted" with backslash escapes."""
    words, i, n = [], 0, len(value)
    while i < n:
        if value[i] == " ":
            i += 1
            continue
        if value[i] != '"':
            j = value.find(" ", i)
            j = n if j < 0 else j
            words.append(value[i:j])
            i = j
            continue
        i += 1
        out = []
        while i < n and value[i] != '"':
            c = value[i]
            if c == "\\" and i + 1 < n:
                nxt = value[i + 1]
                if nxt in _ESC:
                    out.append(_ESC[nxt])
                    i += 2
                    continue
                if nxt == "x" and re.match(r"[0-9a-fA-F]{2}", value[i + 2:i + 4]):
                    out.append(chr(int(value[i + 2:i + 4], 16)))
                    i += 4
                    continue
                if re.match(r"[0-7]{3}", value[i + 1:i + 4]):
                    out.append(chr(int(value[i + 1:i + 4], 8)))
                    i += 4
                    continue
            out.append(c)
            i += 1
        if i >= n:
            raise ValueError(f"unterminated quote in {value[:80]!r}")
        words.append("".join(out))
        i += 1
    return words


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "[not set]") else None
    except ValueError:
        return None


def parse(stdout: str, service: str = "") -> SystemdUnit:
    if stdout.strip() == NO_SYSTEMCTL:
        return SystemdUnit(unit=service, available=False)
    raw: dict[str, list[str]] = {}
    last = None
    text = stdout[:-1] if stdout.endswith("\n") else stdout
    for line in text.split("\n"):  # not splitlines(): argv words may hold \x85, \u2028 …
        key, sep, value = line.partition("=")
        if sep and key in PROPERTIES:
            raw.setdefault(key, []).append(value)
            last = key
        elif last is not None:       # systemctl prints an argv word's newline as is: same value
            raw[last][-1] += "\n" + line
        elif line.strip():
            raise ValueError(f"unexpected line {line[:80]!r}")

    def one(key: str) -> str | None:
        values = raw.get(key)
        return (values[-1] or None) if values else None

    env: dict[str, str] = {}
    for value in raw.get("Environment", []):
        for word in split_words(value):
            name, _, val = word.partition("=")
            env[name] = val
    dropins = [w for v in raw.get("DropInPaths", []) for w in split_words(v)]
    execs = [parse_exec(v) for v in raw.get("ExecStart", []) if v.strip()]
    return SystemdUnit(
        unit=service, load_state=one("LoadState"), active_state=one("ActiveState"), sub_state=one("SubState"),
        main_pid=_int(one("MainPID")), fragment_path=one("FragmentPath"), dropin_paths=dropins,
        exec_start=execs, environment=env, n_restarts=_int(one("NRestarts")), result=one("Result"),
        unit_file_state=one("UnitFileState"), source_path=one("SourcePath"),
        need_daemon_reload=one("NeedDaemonReload") == "yes", raw=raw)

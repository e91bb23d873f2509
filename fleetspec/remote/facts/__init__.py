"""Facts: what a host is, read by a command and a pure parser (as pyinfra's facts are).

Each module `fleetspec.remote.facts.<name>` has `command(**params) -> str` (a shell string built
with shlex.quote) and `parse(stdout, **params) -> dataclass`. `gather` runs one; `gather_many`
runs several in ONE round trip, each in its own subshell, its stdout/stderr/exit status framed by
a separator no output can contain (a random token per batch).
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Mapping, Sequence

from fleetspec.errors import RemoteError
from fleetspec.remote import files
from fleetspec.remote.api import TransportLike


class FactError(RemoteError):
    """A fact's command failed or its output did not parse; the message says which and why."""


@dataclass
class RawFact:
    stdout: str
    stderr: str
    rc: int


def gather(transport: TransportLike, module: ModuleType, timeout: float | None = None, **params: Any) -> Any:
    """Run one fact and parse it; a failure raises FactError."""
    result = gather_many(transport, [(module, params)], timeout=timeout, errors="raise")
    return result[0]


def build_batch(items: Sequence[tuple[ModuleType, Mapping[str, Any]]], token: str) -> str:
    """One shell script running every fact's command in a subshell, framed by `token` lines."""
    parts = ['_fs_err=$(mktemp) || exit 97', 'trap \'rm -f "$_fs_err"\' EXIT']
    for i, (module, params) in enumerate(items):
        command = module.command(**params)
        parts.append(
            f"printf '\\n%s\\n' {shlex.quote(f'{token} {i} out')}; "
            f"( {command}\n) 2>\"$_fs_err\"; _fs_rc=$?; "
            f"printf '\\n%s %s\\n' {shlex.quote(f'{token} {i} err')} \"$_fs_rc\"; cat \"$_fs_err\"")
    parts.append(f"printf '\\n%s\\n' {shlex.quote(f'{token} end')}")
    return "\n".join(parts)


def split_batch(stdout: str, token: str, count: int) -> list[RawFact | None]:
    """The framed sections of a batch's stdout; None for a fact whose frame is missing."""
    out: list[RawFact | None] = [None] * count
    # Every frame line is preceded by a newline we printed ourselves; strip exactly that one.
    pieces = stdout.split(f"\n{token} ")
    for i in range(1, len(pieces)):
        head, _, body = pieces[i].partition("\n")
        words = head.split()
        if len(words) >= 2 and words[1] == "out" and words[0].isdigit():
            idx = int(words[0])
            if idx < count:
                out[idx] = RawFact(stdout=body, stderr="", rc=-1)
        elif len(words) >= 3 and words[1] == "err" and words[0].isdigit():
            idx = int(words[0])
            raw = out[idx] if idx < count else None
            if raw is not None:
                raw.rc = int(words[2]) if words[2].lstrip("-").isdigit() else -1
                raw.stderr = body
    return out


def gather_many(transport: TransportLike, items: Any, timeout: float | None = None, errors: str = "none",
                before: str | None = None) -> Any:
    """Run several facts in one round trip.

    `items`: a list of (module, params) -> a list of results in the same order, or a mapping of
    key -> (module, params) -> a dict. A fact that fails is None (errors="none"), its FactError
    (errors="return"), or raises (errors="raise"). `before`: a script run first in the same
    command (a change whose result the facts read); when it fails the command stops there and
    raises as a checked command does.
    """
    keyed = isinstance(items, Mapping)
    keys = list(items) if keyed else list(range(len(items)))
    pairs = [tuple(items[k]) for k in keys]
    token = f"__FLEETSPEC_{secrets.token_hex(12)}__"
    script = build_batch(pairs, token)
    if before is not None:
        script = f"{{ {before}\n}} || exit $?\n{script}"
    r = transport.run_script(script, timeout=timeout, check=before is not None)
    raws = split_batch(r.stdout, token, len(pairs))
    host = getattr(transport, "name", "host")
    results: list[Any] = []
    for (module, params), raw in zip(pairs, raws, strict=True):
        fact = module.__name__.rsplit(".", 1)[-1]
        try:
            if raw is None:
                raise FactError(f"{host}: fact {fact} produced no output (rc={r.rc}: {r.stderr.strip()[:200]})")
            results.append(parse_raw(module, raw, host, params))
        except FactError as err:
            if errors == "raise":
                raise
            results.append(err if errors == "return" else None)
    return dict(zip(keys, results, strict=True)) if keyed else results


def parse_raw(module: ModuleType, raw: RawFact, host: str, params: Mapping[str, Any]) -> Any:
    fact = module.__name__.rsplit(".", 1)[-1]
    accepts = getattr(module, "OK_RC", (0,))
    if raw.rc == files.UNTRUSTED_RC and files.UNTRUSTED in raw.stderr:     # said whole: it says what to fix
        said = [ln for ln in raw.stderr.splitlines() if ln.startswith(files.UNTRUSTED + " ")][-1]
        raise FactError(f"{host}: {said.removeprefix(files.UNTRUSTED + ' ')[:600]}")
    if raw.rc not in accepts:
        detail = (raw.stderr.strip() or raw.stdout.strip()).splitlines()[-1:] or [""]
        raise FactError(f"{host}: fact {fact} failed (rc={raw.rc}): {detail[0][:200]}")
    try:
        return module.parse(raw.stdout, **params)
    except FactError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as err:
        # whatever shape a host's output takes, it is this host's fact that failed
        raise FactError(f"{host}: fact {fact}: cannot parse output: {type(err).__name__}: {err}") from None

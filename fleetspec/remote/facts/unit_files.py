"""The bytes of a service's unit file and drop-ins, and of fleetspec's recorded baseline for it:
what `status` compares to say "unit edited by hand", read in the same round trip as the other
facts (no SFTP session, no second command per host).

Each file is sent base64-encoded on one line, so any bytes (no trailing newline, CR, NUL) come
back exactly.
"""

from __future__ import annotations

import base64
import binascii
import shlex
from dataclasses import dataclass, field

from fleetspec.model.layout import HostLayout


@dataclass(frozen=True)
class UnitFiles:
    fragment_path: str | None
    unit_bytes: bytes | None                          # None: no fragment (unit not found)
    dropins: dict[str, bytes] = field(default_factory=dict)   # path -> bytes, as systemd lists them
    baseline_json: str | None = None                  # baseline.json's text; None: none recorded


def command(service: str) -> str:
    s = shlex.quote(service)
    baseline = shlex.quote(str(HostLayout(service).baseline / "baseline.json"))
    return (f"frag=$(systemctl show -p FragmentPath --value -- {s} 2>/dev/null); "
            f"drops=$(systemctl show -p DropInPaths --value -- {s} 2>/dev/null); "
            f"printf 'fragment %s\\n' \"$frag\"; "
            f"for f in $drops; do printf 'dropin %s\\n' \"$f\"; done; "
            f"for f in $frag $drops; do [ -f \"$f\" ] && printf 'file %s ' \"$f\" && base64 -w0 \"$f\" && echo; done; "
            f"[ -f {baseline} ] && printf 'baseline ' && base64 -w0 {baseline} && echo; true")


def parse(stdout: str, service: str = "") -> UnitFiles:
    fragment, order, blobs, baseline = None, [], {}, None
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "fragment":
            fragment = rest or None
        elif kind == "dropin" and rest:
            order.append(rest)
        elif kind == "file":
            path, _, data = rest.rpartition(" ")
            blobs[path] = _decode(data, path)
        elif kind == "baseline":
            baseline = _decode(rest, "baseline.json").decode("utf-8", "replace")
    return UnitFiles(fragment_path=fragment, unit_bytes=blobs.get(fragment) if fragment else None,
                     dropins={p: blobs[p] for p in order if p in blobs}, baseline_json=baseline)


def _decode(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as err:
        raise ValueError(f"{what}: not base64 ({err})") from None

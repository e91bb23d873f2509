"""The host's sglang option table: the packaged one for its version, else its own parser's dump."""

from __future__ import annotations

from fleetspec.errors import UserError
from fleetspec.model import launch
from fleetspec.remote import files
from fleetspec.remote.api import TransportLike


def option_table(t: TransportLike, python: str, version: str, host: str) -> launch.OptionTable:
    """The packaged table of this sglang version's parser; for a version fleetspec has no table of,
    the host's own parser is asked (one python start, ~10 s)."""
    table = launch.load_table(version)
    if table is not None:
        return table
    r = files.run_python_from_root(t, python, launch.DUMP_SCRIPT, timeout_s=300)
    try:
        table = launch.parse_dump(r.stdout)
    except ValueError as err:
        tail = (r.stderr.strip().splitlines() or [f"exit {r.rc}"])[-1]
        raise UserError(f"{host}: cannot read sglang {version}'s option parser with {python} ({err}: {tail})") from None
    return table

"""How much fleetspec reads from a host at most. Everything a host sends is buffered on the
controller, so a host that answers without end (a `config.json` linked to /dev/zero, an API port
that streams forever) would otherwise take the controller's memory. Past a limit the read stops
and the command, request or transfer fails with one line that names the host, what was read and
the limit. docs/security.md lists them."""

from __future__ import annotations

MIB = 1024 * 1024

HTTP_BODY_MAX = 16 * MIB       # one HTTP answer (/server_info, /generate, /health: a few KiB each)
COMMAND_OUTPUT_MAX = 64 * MIB  # stdout, and stderr, of one command (the biggest: history's ledger archive)
FILE_MAX = 1024 * MIB          # one file fetched whole (get_bytes: a kernel library built on a host)
CONFIG_JSON_MAX = 4 * MIB      # a model's config.json (a few KiB in practice)


def size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n} bytes"

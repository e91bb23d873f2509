"""What the running server says about itself (GET /server_info over the SSH tunnel).

`speculative_algorithm` is what sglang resolved (NEXTN shows as EAGLE); `launch_command` keeps the
flags as written, so callers can show the operator's name for it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from fleetspec.errors import RemoteError
from fleetspec.remote import sglang_api


@dataclass
class ServerInfo:
    speculative_algorithm: str | None
    launch_command: list[str] | None
    version: str | None = None
    avg_spec_accept_length: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def parse(data: dict[str, Any]) -> ServerInfo:
    if not isinstance(data, dict):
        raise ValueError("/server_info did not return a JSON object")
    launch = data.get("launch_command")
    if isinstance(launch, str):
        text = launch
        try:
            launch = shlex.split(text)
        except ValueError:
            launch = text.split()
    elif not isinstance(launch, list):
        launch = None
    accept = None
    states = data.get("internal_states")
    for state in states if isinstance(states, list) else []:
        value = state.get("avg_spec_accept_length") if isinstance(state, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            accept = float(value)
            break
    algo = data.get("speculative_algorithm")
    version = data.get("version")
    return ServerInfo(speculative_algorithm=str(algo) if algo not in (None, "") else None, launch_command=launch,
                      version=version if isinstance(version, str) else None, avg_spec_accept_length=accept,
                      raw=data)


def fetch(transport: Any, port: int, api_key: str | None = None, timeout: float = 5) -> ServerInfo:
    r = transport.http("GET", port, "/server_info", timeout=timeout, headers=sglang_api.auth_headers(api_key))
    if r.status != 200:
        raise RemoteError(f"{transport.name}: GET /server_info returned {r.status}")
    try:
        return parse(r.json())
    except (ValueError, TypeError) as err:
        raise RemoteError(f"{transport.name}: /server_info: {err}") from None

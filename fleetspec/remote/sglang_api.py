"""The SGLang HTTP API as fleetspec calls it: one Bearer header, one `/generate` client.

Probes, gates and the `/server_info` fact all talk to the same service with the same key, so the
header and the request body are built here once and travel over `Transport.http`.
"""

from __future__ import annotations

from fleetspec.errors import RemoteError


def auth_headers(api_key: str | None) -> dict:
    """The Authorization header for a service started with `--api-key`; none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def generate(t, port: int, prompt: str, max_new_tokens: int, *, api_key: str | None = None,
             temperature: float = 0.0, timeout: float = 120) -> dict:
    """POST /generate and return the decoded answer.

    RemoteError when the request fails or answers other than 200; ValueError when the body is
    not JSON. What the answer must hold is the caller's business (probes and gates read
    different fields)."""
    body = {"text": prompt, "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens}}
    r = t.http("POST", port, "/generate", json=body, timeout=timeout, headers=auth_headers(api_key))
    if r.status != 200:
        raise RemoteError(f"/generate answered HTTP {r.status}: {r.body[:200]!r}")
    try:
        return r.json()
    except ValueError:
        raise ValueError("/generate answered something that is not JSON") from None

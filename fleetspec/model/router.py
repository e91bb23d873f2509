"""A router in front of the fleet (sglang-router / SGLang Model Gateway): its admin address, its
credentials (a secret read from the environment at use), how a host's worker URL is named there,
and how many workers must keep serving. Inventory: top-level `routers: {NAME: {...}}`; a host
joins one with the var `router: NAME` (in defaults.vars for the fleet, group_vars for a group)."""

from __future__ import annotations

import string
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from fleetspec.model.yamlload import Fields

WORKER_FIELDS = ("address", "api_port", "name")


@dataclass(frozen=True)
class RouterSpec:
    name: str
    admin_url: str
    worker_url: str = "http://{address}:{api_port}"
    api_key_env: str | None = None
    min_serving: int = 1
    drain_timeout: float = 120.0       # bounded wait for a removed worker's in-flight requests
    add_timeout: float = 120.0         # how long the router may take to list a worker as healthy

    def worker_for(self, name: str, address: str, api_port: int) -> str:
        return self.worker_url.format(address=address, api_port=api_port, name=name).rstrip("/")


def _url(f: Fields, key: str, value: str, what: str) -> None:
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        f.fail(key, f"expected an http(s) URL ({what}), got {value!r}")


def parse_routers(f: Fields, path: Path) -> Mapping[str, RouterSpec]:
    out: dict[str, RouterSpec] = {}
    for name in list(f.data):
        if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_.-" for c in name):
            f.fail(str(name), "router names are letters, digits, '.', '_' or '-'")
        r = f.sub(name)
        admin = r.get("admin_url", str, required=True)
        _url(r, "admin_url", admin, "the router's admin address, e.g. http://router.example:30000")
        template = r.get("worker_url", str, RouterSpec.worker_url)
        try:
            fields = {p[1] for p in string.Formatter().parse(template) if p[1] is not None}
        except ValueError as err:
            r.fail("worker_url", f"expected a template like http://{{address}}:{{api_port}} ({err})")
        if not fields <= set(WORKER_FIELDS) or "{" in template.replace("{address}", "").replace(
                "{api_port}", "").replace("{name}", ""):
            r.fail("worker_url", f"expected a template using only {{address}}, {{api_port}}, {{name}}, got {template!r}")
        _url(r, "worker_url", template.format(address="h.example", api_port=1, name="h"), "after filling it in")
        key_env = None
        if r.data.get("api_key") is not None:
            k = r.sub("api_key")
            key_env = k.get("secret_env", str, required=True)
            k.done()
        min_serving = r.get("min_serving", int, RouterSpec.min_serving)
        if min_serving < 0:
            r.fail("min_serving", f"expected 0 or more workers, got {min_serving}")
        timeouts: dict[str, Any] = {}
        for key in ("drain_timeout", "add_timeout"):
            value = r.get(key, float, getattr(RouterSpec, key))
            if value <= 0:
                r.fail(key, f"expected a positive number of seconds, got {value}")
            timeouts[key] = value
        r.done()
        out[name] = RouterSpec(name=name, admin_url=admin.rstrip("/"), worker_url=template,
                               api_key_env=key_env, min_serving=min_serving, **timeouts)
    f.done()
    return out

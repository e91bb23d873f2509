"""A playbook's launch flags rendered for one host (jinja over the host's vars and the options)."""

from __future__ import annotations

from typing import Any, Mapping

import jinja2

from fleetspec.errors import UserError
from fleetspec.model.playbook import Playbook

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)


def render_flags(playbook: Playbook, host_vars: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
    """The playbook's launch flags as argv tokens for one host (jinja over `host` and `options`)."""
    context = {"host": dict(host_vars), "options": dict(options)}
    out: list[str] = []
    for i, flag in enumerate(playbook.launch.flags):
        where = f"{playbook.path}: launch.flags[{i}]"
        try:
            if flag.when is not None and not _ENV.compile_expression(flag.when)(**context):
                continue
            for token in flag.tokens:
                rendered = _ENV.from_string(token).render(**context) if ("{{" in token or "{%" in token) else token
                if rendered == "" or rendered == "None":
                    raise UserError(f"{where}: {token!r} rendered empty for this host (set the var in the inventory)")
                out.append(rendered)
        except jinja2.UndefinedError as err:
            raise UserError(f"{where}: {err.message} (set it in the inventory's vars or the playbook's options)") from None
        except jinja2.TemplateError as err:
            raise UserError(f"{where}: bad template: {err}") from None
    return out

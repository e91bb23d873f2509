"""A playbook's launch flags rendered for one host (jinja over the host's vars and the options),
with the values they were rendered from: what reads a flag's value (model/graphsize.py) takes the
value, never the text parsed back."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import jinja2

from fleetspec import render
from fleetspec.errors import UserError
from fleetspec.model.playbook import Playbook

_ENV = render.environment()
_WHOLE = re.compile(r"\{\{([^{}]*)\}\}")     # fullmatch: a token that is one expression


@dataclass(frozen=True)
class Flags:
    argv: list[str]                                        # the tokens, rendered
    values: dict[str, Any] = field(default_factory=dict)   # option word -> its argument's value


def render_flags(playbook: Playbook, host_vars: Mapping[str, Any], options: Mapping[str, Any]) -> Flags:
    """The playbook's launch flags as argv tokens for one host (jinja over `host` and `options`).
    An option's argument that is one `{{ expression }}` is kept as the expression's value (an int
    stays an int); a literal argument as written."""
    context = {"host": dict(host_vars), "options": dict(options)}
    out: list[str] = []
    values: dict[str, Any] = {}
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
            if len(flag.tokens) == 2 and flag.tokens[0].startswith("-"):
                whole = _WHOLE.fullmatch(flag.tokens[1])
                values[flag.tokens[0]] = (_ENV.compile_expression(whole[1].strip())(**context) if whole
                                          else out[-1])
        except jinja2.UndefinedError as err:
            raise UserError(f"{where}: {err.message} (set it in the inventory's vars or the playbook's options)") from None
        except jinja2.TemplateError as err:
            raise UserError(f"{where}: bad template: {err}") from None
    return Flags(out, values)

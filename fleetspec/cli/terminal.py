"""What reaches the operator's terminal: text a host sent (a served algorithm, a probe's reason, a
ledger line, a journal line, a lock holder's record) may carry escape sequences. Click strips only
CSI sequences, and only when not on a terminal; OSC 52 (set the clipboard), OSC 8 (links), a bare
ESC, C1 controls (U+0080-U+009F, e.g. U+009B, a one-character CSI) and bidirectional overrides
would reach the screen. Every line fleetspec prints goes through `safe` (cli/output.py's `echo`,
`Out`, `Progress`): such characters are shown as `\\xNN` / `\\uNNNN`, newline and tab are kept.

Styles (colour, bold, dim) are used only where `styled()` allows: never under `NO_COLOR` (any
non-empty value, as no-color.org asks) or `--no-color`. rich alone drops only the colours there."""

from __future__ import annotations

import os
import re

# C0 but newline and tab, DEL, C1; the bidirectional embeddings, overrides and isolates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(text: str) -> str:
    """`text` with every control character but newline and tab made visible."""
    return _UNSAFE.sub(_shown, text)


def styled() -> bool:
    """Whether output may carry styles: not under NO_COLOR or the root command's --no-color."""
    if os.environ.get("NO_COLOR"):
        return False
    import click

    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return not getattr(obj, "no_color", False)

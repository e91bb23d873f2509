"""Terminal output: step lines, one overwritten progress line while a model loads, tables."""

from __future__ import annotations

import sys
import threading

import click


class Progress:
    """Step lines go to stdout as they happen; the progress line is redrawn in place on a TTY
    and printed at most every few seconds elsewhere, so logs stay readable."""

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self._lock = threading.Lock()
        self._shown = False
        self._last_plain: dict[str, float] = {}

    def echo(self, line: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._clear()
            click.echo(line, file=self.stream)

    def line(self, text: str | None) -> None:
        if not self.enabled:
            return
        import time

        with self._lock:
            if text is None:
                self._clear()
                return
            if self.tty:
                self.stream.write("\r\x1b[2K" + text[: click.get_terminal_size()[0] - 1])
                self.stream.flush()
                self._shown = True
            else:
                key = text.split("]", 1)[0]
                now = time.monotonic()
                if now - self._last_plain.get(key, 0) >= 5:
                    self._last_plain[key] = now
                    click.echo(text, file=self.stream)

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._shown = False


def echo_table(headers: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for h in headers:
        table.add_column(h, overflow="fold")
    for row in rows:
        table.add_row(*[str(c) for c in row])
    Console(width=max(120, Console().width), soft_wrap=False).print(table)


def verbose_observer(obj, stream=None):
    """`-v`: one line per remote action on stderr: host, seconds, outcome, then the command
    (continuation lines indented). Values of the inventory's secret env vars are hidden too."""
    lock = threading.Lock()

    def secrets() -> list[str]:
        inv = obj.__dict__.get("inv")
        if inv is None:
            return []
        values = {h.vars.api_key.value() for h in inv.hosts.values() if h.vars.api_key}
        return sorted((v for v in values if v and len(v) >= 4), key=len, reverse=True)

    def observe(host: str, what: str, seconds: float, outcome: str) -> None:
        for value in secrets():
            what = what.replace(value, "***")
        lines = what.strip("\n").splitlines() or [""]
        text = f"[{host}] {seconds:.3f}s {outcome}: {lines[0]}" + "".join(f"\n    {x}" for x in lines[1:])
        with lock:
            click.echo(text, err=True, file=stream)

    return observe

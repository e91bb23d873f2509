"""Terminal output: step lines, one overwritten progress line while a model loads, tables."""

from __future__ import annotations

import shutil
import sys
import threading

import click

from fleetspec.cli.terminal import safe


def echo(message="", err: bool = False, file=None, nl: bool = True) -> None:
    """click.echo for every line fleetspec prints: control characters a host may have sent are
    made visible (cli/terminal.py). Nothing in fleetspec/cli calls click.echo but this."""
    click.echo(safe(str(message)), err=err, file=file, nl=nl)


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
            echo(line, file=self.stream)

    def line(self, text: str | None) -> None:
        if not self.enabled:
            return
        import time

        with self._lock:
            if text is None:
                self._clear()
                return
            if self.tty:
                self.stream.write("\r\x1b[2K" + safe(text)[: shutil.get_terminal_size()[0] - 1])
                self.stream.flush()
                self._shown = True
            else:
                key = text.split("]", 1)[0]
                now = time.monotonic()
                if now - self._last_plain.get(key, 0) >= 5:
                    self._last_plain[key] = now
                    echo(text, file=self.stream)

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._shown = False


def wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """Lines of at most `width` columns, broken at spaces only (a longer word stands alone)."""
    import textwrap

    first = indent if first is None else first
    return textwrap.wrap(text, width=max(20, width), initial_indent=first, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


class Out:
    """Prints plain text lines, colouring a leading span when the console allows it."""

    def __init__(self):
        from rich.console import Console
        from rich.text import Text

        self.console, self.Text = Console(highlight=False, soft_wrap=True), Text
        self.width = self.console.width

    def line(self, text: str = "", style_spans=()) -> None:
        t = self.Text(safe(text))
        for start, end, style in style_spans:
            t.stylize(style, start, end)
        self.console.print(t, soft_wrap=True)

    def styled(self, text: str, word: str, style: str | None) -> None:
        i = text.find(word) if style else -1
        self.line(text, [(i, i + len(word), style)] if i >= 0 else ())


def echo_table(headers: list[str], rows: list[list], width: int | None = None) -> None:
    """A table that fits the terminal and never cuts a word: columns without spaces keep their
    width, the others wrap at spaces; when even that does not fit, one block per row."""
    for line in table_lines(headers, rows, width or _width()):
        echo(line)


def _width() -> int:
    from rich.console import Console

    return Console().width


def table_lines(headers: list[str], rows: list[list], width: int) -> list[str]:
    import textwrap

    cells = [[str(c) for c in row] for row in rows]
    n = len(headers)
    natural = [max([len(headers[i])] + [len(r[i]) for r in cells]) for i in range(n)]
    longest = [max([len(w) for r in cells for w in r[i].split()] + [len(headers[i])]) for i in range(n)]
    wraps = [i for i in range(n) if natural[i] > longest[i]]
    room = width - 2 * (n - 1) - sum(natural[i] for i in range(n) if i not in wraps)
    widths = list(natural)
    if wraps and room < sum(natural[i] for i in wraps):
        need = sum(longest[i] for i in wraps)
        if room < need:
            return _blocks(headers, cells, width)
        spare = room - need                     # shared in proportion to what each would like
        want = sum(natural[i] - longest[i] for i in wraps)
        for i in wraps:
            widths[i] = longest[i] + spare * (natural[i] - longest[i]) // want
    elif room < 0:
        return _blocks(headers, cells, width)

    def render(row: list[str]) -> list[str]:
        parts = [textwrap.wrap(c, widths[i], break_long_words=False, break_on_hyphens=False) or [""]
                 if i in wraps else [c] for i, c in enumerate(row)]
        height = max(len(p) for p in parts)
        return ["  ".join((p[k] if k < len(p) else "").ljust(widths[i]) for i, p in enumerate(parts)).rstrip()
                for k in range(height)]

    out = render(list(headers))
    for row in cells:
        out += render(row)
    return out


def _blocks(headers: list[str], cells: list[list[str]], width: int) -> list[str]:
    import textwrap

    out = []
    for row in cells:
        out.append(row[0])
        for h, c in zip(headers[1:], row[1:], strict=True):
            out += textwrap.wrap(f"{h}: {c}", width, initial_indent="  ", subsequent_indent="      ",
                                 break_long_words=False, break_on_hyphens=False) or [f"  {h}:"]
    return out


def verbose_observer(obj, stream=None):
    """`-v`: one line per remote action on stderr: host, seconds, outcome, then the command
    (continuation lines indented). Values of the inventory's secret env vars are hidden too."""
    import os

    lock = threading.Lock()
    names: list[str] = []

    def secret_env_names() -> list[str]:
        """Names the playbooks mark secret (launch.secret_env), read once."""
        if not names:
            names.append("")
            try:
                import yaml

                for p in sorted((obj.root_path / "playbooks").glob("*.yaml")):
                    launch = (yaml.safe_load(p.read_text()) or {}).get("launch") or {}
                    names.extend(n for n in launch.get("secret_env") or [] if isinstance(n, str))
            except Exception:  # no root or a bad playbook: the command says so itself
                pass
        return names[1:]

    def secrets() -> list[str]:
        inv = obj.__dict__.get("inv")
        values = {h.vars.api_key.value() for h in inv.hosts.values() if h.vars.api_key} if inv else set()
        values |= {os.environ.get(n) for n in secret_env_names()}
        return sorted((v for v in values if v and len(v) >= 4), key=len, reverse=True)

    def observe(host: str, what: str, seconds: float, outcome: str) -> None:
        for value in secrets():
            what = what.replace(value, "***")
        lines = what.strip("\n").splitlines() or [""]
        text = f"[{host}] {seconds:.3f}s {outcome}: {lines[0]}" + "".join(f"\n    {x}" for x in lines[1:])
        with lock:
            echo(text, err=True, file=stream)

    return observe

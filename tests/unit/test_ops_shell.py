"""Shell lives in remote/: ops/ writes no systemctl or journalctl line of its own, not even the
ones a message hands an operator (those come from remote/systemd.py's builders, quoted there)."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

from fleetspec.remote import systemd

OPS = Path(__file__).resolve().parents[2] / "fleetspec" / "ops"
# A command word where a shell would run it: at the start, or after a space, `;`, `&` or a quote.
# Prose names them in backticks or parentheses ("`systemctl show`", "(journalctl -k, dmesg)").
SHELL = re.compile(r"(?:^|[ ;&'])(systemctl|journalctl) ")


def _strings(tree: ast.AST):
    """Every string constant outside docstrings, f-strings piece by piece."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_ops_builds_no_systemctl_or_journalctl_line():
    found = [f"{path.name}:{line}: {text!r}" for path in sorted(OPS.glob("*.py"))
             for line, text in _strings(ast.parse(path.read_text(), str(path)))
             if SHELL.search(text) or "run_script(" in text]
    assert not found, found


def test_the_operator_lines_quote_every_word():
    service, dropin, address = "a b'c.service", "/etc/systemd/system/a b'c.service.d/zz-fleetspec.conf", "gpu-1.example"
    line = systemd.on_host_command(address, systemd.remove_dropin_command(dropin, service))
    ssh, host, remote = shlex.split(line)
    assert (ssh, host) == ("ssh", address)
    assert shlex.split(remote) == ["rm", dropin, "&&", "systemctl", "daemon-reload", "&&", "systemctl", "restart",
                                   service]
    assert shlex.split(shlex.split(systemd.on_host_command(address, systemd.journal_command(service)))[2]) == \
        ["journalctl", "-u", service, "-n", "50"]
    assert shlex.split(systemd.status_command(service)) == ["systemctl", "status", service]

"""A file's text, or None when it does not exist: a small read (the ledger) that rides in a
batch with the other facts instead of costing a round trip of its own."""

from __future__ import annotations

from fleetspec.remote import files


def command(path: str) -> str:
    return files.read_optional(path, files.ABSENT)


def parse(stdout: str, path: str = "") -> str | None:
    return None if stdout == files.ABSENT else stdout

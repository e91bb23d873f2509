"""Seconds per test file from pytest's JUnit XML files (`python3 scripts/test_times.py XML...`):
where a run's time went, file by file, the slowest first. scripts/test.sh prints it at the end."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def per_file(paths: list[str]) -> list[tuple[float, int, str]]:
    """(seconds, tests, file) for every test file in the reports, the slowest first."""
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            continue
        for case in root.iter("testcase"):
            parts = case.get("classname", "").split(".")
            while len(parts) > 1 and parts[-1][:1].isupper():     # a test class, not a module
                parts.pop()
            name = "/".join(parts) + ".py"
            seconds[name] += float(case.get("time") or 0)
            counts[name] += 1
    return sorted(((s, counts[f], f) for f, s in seconds.items()), reverse=True)


def main(argv: list[str]) -> int:
    for s, n, f in per_file(argv):
        print(f"{s:8.1f}s  {n:4d} tests  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

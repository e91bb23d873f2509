"""The lab's `nvidia-smi`: answers the CSV queries fleetspec asks from fixture tables, on a lab host
that has no GPU. Installed as /usr/local/bin/nvidia-smi by `fleetspec lab fault HOST gpu=CASE`
(with a `journalctl` whose kernel log is the case's kernel.log) and removed by `lab fault --clear`.

The tables (`tests/fixtures/nvidia-smi/health/<case>/query-*.csv`) are written in the format
nvidia-smi documents for `--format=csv` (a header of field names with their units in brackets,
then one line per GPU, comma + space separated, values with units); they are written by hand from
the documentation, not captured from a GPU. A query picks columns by field name and honours
`noheader` and `nounits`; a field the table does not have is refused as nvidia-smi refuses it
(so an old-driver table without `clocks_event_reasons.active` makes fleetspec ask again with
`clocks_throttle_reasons.active`, as it must on such a driver). Standard library only: it runs
in the host's system python.
"""

from __future__ import annotations

import csv
import os
import sys

HERE = os.environ.get("FLEETSPEC_LAB_GPU", "/etc/fleetspec-lab/gpu")
TABLES = {"--query-gpu": "query-gpu.csv", "--query-remapped-rows": "query-remapped-rows.csv",
          "--query-compute-apps": "query-compute-apps.csv"}
ALIASES = {"used_memory": "used_gpu_memory", "gpu_name": "name"}


def _table(name: str) -> tuple[list[str], list[str], list[list[str]]]:
    """(field names, their units, rows) of one fixture table."""
    with open(os.path.join(HERE, name), newline="") as fh:
        rows = [r for r in csv.reader(fh, skipinitialspace=True) if r]
    if not rows:
        return [], [], []
    names, units = [], []
    for head in rows[0]:
        field, _, unit = head.strip().partition(" [")
        names.append(field)
        units.append(unit.rstrip("]"))
    return names, units, [[c.strip() for c in r] for r in rows[1:]]


def _value(text: str, unit: str, nounits: bool) -> str:
    if nounits and unit and text.endswith(" " + unit):
        return text[: -len(unit) - 1]
    return text


def query(option: str, fields: str, fmt: str) -> int:
    names, units, rows = _table(TABLES[option])
    picks = []
    for field in fields.split(","):
        field = field.strip()
        name = field if field in names else ALIASES.get(field, field)
        if name not in names:
            print(f'Field "{field}" is not a valid field to query.')
            return 2
        picks.append(names.index(name))
    flags = fmt.split(",")
    if "csv" not in flags:
        print(f"fleetspec lab nvidia-smi: only --format=csv is served, got {fmt!r}")
        return 2
    nounits = "nounits" in flags
    if "noheader" not in flags:
        print(", ".join(names[i] + (f" [{units[i]}]" if units[i] and not nounits else "") for i in picks))
    for row in rows:
        print(", ".join(_value(row[i], units[i], nounits) for i in picks))
    return 0


def main(argv: list[str]) -> int:
    if not os.path.isdir(HERE):
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "(fleetspec lab: no fixture folder)")
        return 9
    opts = {a.partition("=")[0]: a.partition("=")[2] for a in argv}
    for option in TABLES:
        if option in opts:
            return query(option, opts[option], opts.get("--format", "csv"))
    with open(os.path.join(HERE, "case")) as fh:
        case = fh.read().strip()
    print(f"fleetspec lab stand-in for nvidia-smi (fixture case {case}; not a GPU): only the CSV queries "
          f"{', '.join(TABLES)} are answered")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

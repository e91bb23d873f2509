"""What a host's ledger costs a deploy as the host ages, with and without rotation.

Every deploy reads the host's whole ledger under its lock and parses it on the controller. Without
rotation that grows with every deploy the host ever had; with it (model.ledger.rotation, run by a
healthy deploy's last command) the ledger stays under ROTATE_AT_BYTES plus what a deploy adds.
This simulates a host's life on the controller alone, with the real parser, the real rotation
rule and the real prune rule: each deploy appends its lines (`--lines` lines of the lab's mean
size, 180 B), is healthy, prunes beyond `--keep` releases. Printed per age: the ledger's bytes and
the parse time, both ways, and the ratio. No host is involved; the SSH read of the bytes is not
counted (it is ~1 ms per 100 kB on loopback, bench/ssh_overhead.py).

    python3 bench/ledger_size.py [--deploys 1000] [--lines 24] [--keep 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetspec.model import ledger as L
from fleetspec.ops.planning import prune_candidates

PAD = 180 - 150     # a generated line's size without the pad is ~150 B


def release_id(n: int) -> str:
    return f"20261201T{n:06d}Z-ddtree"


def deploy_lines(n: int, lines: int) -> list[str]:
    rid = release_id(n)
    out = [L.Entry("status", rid, "release", L.STARTED, by="ops@ctl:1").to_line()]
    out += [L.Entry("step", rid, f"step{i}", "ok", by="ops@ctl:1", detail={"s": "x" * PAD}).to_line()
            for i in range(lines - 2)]
    out.append(L.Entry("status", rid, "release", L.HEALTHY, by="ops@ctl:1").to_line())
    return out


def parse_ms(text: str) -> float:
    L._parse.cache_clear()
    began = time.perf_counter()
    L.parse(text)
    return (time.perf_counter() - began) * 1000


def drop(text: str, ranges: list[tuple[int, int]]) -> str:
    gone = {n for a, b in ranges for n in range(a, b + 1)}
    return "\n".join(line for n, line in enumerate(text.split("\n"), 1) if n not in gone)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deploys", type=int, default=1000)
    ap.add_argument("--lines", type=int, default=24)
    ap.add_argument("--keep", type=int, default=3)
    args = ap.parse_args()
    grown = rotated = ""
    rotations = 0
    show = {10, 100, 300, 1000, 3000, args.deploys}
    print(f"{'deploys':>8} {'grown kB':>9} {'parse ms':>9} {'rotated kB':>11} {'parse ms':>9} {'ratio':>6}")
    for n in range(1, args.deploys + 1):
        new = "".join(line + "\n" for line in deploy_lines(n, args.lines))
        grown += new
        read = rotated                      # what this deploy's lock read
        rotated += new
        statuses = L.parse(rotated).releases()
        for old in prune_candidates(statuses, release_id(n), args.keep):
            rotated += L.Entry("status", old, "release", L.PRUNED, by="ops@ctl:1").to_line() + "\n"
        ranges = L.rotation(read)
        if ranges:
            rotations += 1
            rotated = drop(read, ranges) + rotated[len(read):]
        if n in show:
            g, r = parse_ms(grown), parse_ms(rotated)
            print(f"{n:>8} {len(grown) / 1e3:>9.0f} {g:>9.1f} {len(rotated) / 1e3:>11.0f} {r:>9.1f} {r / g:>6.2f}")
    print(f"rotations: {rotations} in {args.deploys} deploys (threshold {L.ROTATE_AT_BYTES // 1024} KiB)")


if __name__ == "__main__":
    main()

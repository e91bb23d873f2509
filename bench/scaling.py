"""How bench/fleet.py's figures grow with N, and what that says about 500 hosts.

Fits, per series, least squares lines own(N) = a + c·N and cpu(N) = p + q·N over the rows of one
deploy of N hosts at once (--serial 100%, --parallel N). On the lab, c is mostly the hosts' own
work (the smoke step's sglang import) waiting for the two cores every container shares with the
controller; on a real fleet each host has its own CPUs, and what grows with P hosts at once is the
controller's CPU, q·P: fleetspec is one Python process, so its paramiko work shares one core.

Extrapolation of TOTAL hosts in batches of P (`--serial P`): ceil(TOTAL/P) batches, each the
engine's load L plus fleetspec's own time, which is one host's own time o1 while the controller
keeps up and p + q·P once it does not ("own machines": batch = L + max(o1, p + q·P)); the lab
column keeps the lab's fit (batch = L + a + c·P). The knee P* = (o1 - p)/q is where the
controller's CPU for a batch equals one host's own time: past it a batch's own time grows by q
per host and TOTAL hosts cost at least p + q·TOTAL seconds however they are batched. Stand-in
figures, extrapolated: an estimate, not a measurement.
"""

from __future__ import annotations

import math
import statistics

TOTAL = 500
PARALLEL = (8, 16, 32, 64, 128)


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y) points; slope 0 for one x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def plan(load: float, one: float, p: float, q: float, total: int = TOTAL) -> list[dict]:
    """One row per --parallel P (hosts on their own machines): batches, batch and total seconds."""
    out = []
    for par in PARALLEL:
        batch = load + max(one, p + q * par)
        batches = math.ceil(total / par)
        out.append({"parallel": par, "batches": batches, "batch_s": batch, "total_s": batches * batch,
                    "own_x_one": max(one, p + q * par) / one})
    return out


def knee(one: float, p: float, q: float) -> float:
    """P* where the controller's CPU for a batch reaches one host's own time."""
    return (one - p) / q if q > 0 else float("inf")


def series(rows: list[dict], kind: str) -> list[dict]:
    return sorted((r for r in rows if r.get("kind", "full") == kind), key=lambda r: r["n"])


def report(rows: list[dict]) -> str:
    lines = ["Growth with N (least squares over the rows; stand-in figures):", ""]
    fits = {}
    for kind in ("full", "thin"):
        rs = series(rows, kind)
        if len(rs) < 2:
            continue
        a, c = fit([(r["n"], r["deploy_own_s"]) for r in rs])
        p, q = fit([(r["n"], r["deploy_client_cpu_s"]) for r in rs])
        s0, s1 = fit([(r["n"], r["status_s"]) for r in rs])
        load = statistics.median(r["deploy_s"] - r["deploy_own_s"] for r in rs)
        fits[kind] = (load, a, c, p, q, rs[0]["deploy_own_s"])
        lines.append(f"- {kind}: own(N) = {a:.2f} + {c:.3f}·N s; client CPU(N) = {p:.2f} + {q:.3f}·N s; "
                     f"status(N) = {s0:.2f} + {s1:.3f}·N s; engine wait L = {load:.1f} s; one host's own "
                     f"time o1 = {rs[0]['deploy_own_s']:.2f} s (N = {', '.join(str(r['n']) for r in rs)})")
    if not fits:
        return "\n".join(lines)
    kind = "thin" if "thin" in fits else "full"
    _, a, c, p, q, one = fits[kind]
    load = fits["full"][0] if "full" in fits else fits[kind][0]
    lines += ["", f"Extrapolated to {TOTAL} hosts from the {kind} fit in batches of P (--serial P), engine load "
              f"L = {load:.1f} s (the {'full stand-in' if 'full' in fits else 'thin engine'}'s; a real engine's load "
              f"replaces it). Knee "
              f"P* = (o1 - p)/q = {knee(one, p, q):.0f} hosts at once; at least p + q·{TOTAL} = "
              f"{p + q * TOTAL:.0f} s of controller CPU in all:", "",
              "| --parallel P | batches | own machines: batch s | own machines: total min | own time × one host | "
              "lab: batch s | lab: total min |", "|---|---|---|---|---|---|---|"]
    for row in plan(load, one, p, q):
        lab = load + a + c * row["parallel"]
        lines.append(f"| {row['parallel']} | {row['batches']} | {row['batch_s']:.1f} | {row['total_s'] / 60:.1f} | "
                     f"{row['own_x_one']:.2f} | {lab:.1f} | {row['batches'] * lab / 60:.1f} |")
    return "\n".join(lines)

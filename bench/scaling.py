"""How bench/fleet.py's figures grow with N, and what that says about 500 hosts (issue 17).

Fits, per series, least squares lines own(N) = a + c·N and cpu(N) = p + q·N over the rows of one
deploy of N hosts at once (--serial 100%, --parallel N). Extrapolates a deploy of TOTAL hosts in
batches of P (`--serial P`, --parallel P): ceil(TOTAL/P) batches, each lasting the engine's load L
plus fleetspec's own time a + c·P, but never less than the controller's CPU for the batch, q·P
(fleetspec is one Python process: its paramiko work shares one core). Two columns: "lab" keeps c
as measured (the lab's hosts share the controller's two cores, so c is mostly on-host work
waiting for CPU), "own machines" sets c to the controller's share only (c = q), as when every
host has its own CPUs. Stand-in figures, extrapolated: an estimate, not a measurement.
"""

from __future__ import annotations

import math

TOTAL = 500
PARALLEL = (8, 16, 32, 64, 128)
BUSY = 0.5   # the controller's CPU may be busy at most this share of a batch before it is the bottleneck


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


def batch_seconds(load: float, a: float, c: float, q: float, p: int) -> float:
    return max(load + a + c * p, q * p)


def plan(load: float, a: float, c: float, q: float, total: int = TOTAL) -> list[dict]:
    """One row per --parallel P: batches, wall time for `total` hosts, the controller's busy share."""
    out = []
    for p in PARALLEL:
        batch = batch_seconds(load, a, c, q, p)
        batches = math.ceil(total / p)
        out.append({"parallel": p, "batches": batches, "batch_s": batch, "total_s": batches * batch,
                    "controller_busy": q * p / batch})
    return out


def max_parallel(load: float, a: float, c: float, q: float) -> int:
    """The largest P whose batch keeps the controller's CPU at most BUSY of one core."""
    if q <= BUSY * c:
        return 10 ** 6
    return max(1, int((BUSY * (load + a)) / (q - BUSY * c)))


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
        load = sum(r["deploy_s"] - r["deploy_own_s"] for r in rs) / len(rs)
        fits[kind] = (load, a, c, q)
        lines.append(f"- {kind}: own(N) = {a:.2f} + {c:.3f}·N s; client CPU(N) = {p:.2f} + {q:.3f}·N s; "
                     f"status(N) = {s0:.2f} + {s1:.3f}·N s; engine wait L = {load:.1f} s "
                     f"(N = {', '.join(str(r['n']) for r in rs)})")
    if "thin" not in fits:
        return "\n".join(lines)
    load, a, c, q = fits["thin"]
    if "full" in fits:
        load = fits["full"][0]
    lines += ["", f"Extrapolated to {TOTAL} hosts from the thin fit, batches of P (--serial P), engine load "
              f"L = {load:.1f} s (the full stand-in's; a real engine's load time replaces it):", "",
              "| --parallel P | batches | lab: batch s | lab: total min | own machines: batch s | "
              "own machines: total min | controller CPU busy (own machines) |", "|---|---|---|---|---|---|---|"]
    for lab_row, own_row in zip(plan(load, a, c, q), plan(load, a, q, q), strict=True):
        lines.append(f"| {lab_row['parallel']} | {lab_row['batches']} | {lab_row['batch_s']:.1f} | "
                     f"{lab_row['total_s'] / 60:.1f} | {own_row['batch_s']:.1f} | {own_row['total_s'] / 60:.1f} | "
                     f"{own_row['controller_busy']:.0%} |")
    lines += ["", f"Largest --parallel with the controller's CPU at most {BUSY:.0%} busy: "
              f"{max_parallel(load, a, q, q)} (own machines), {max_parallel(load, a, c, q)} (lab)."]
    return "\n".join(lines)

"""The deploy's steps, in order, written once: `Deploy.run` runs them, `--plan` prints them, and
the lab's kill sweep (tests/lab/test_reliability_crash.py) stops a deploy at each."""

from __future__ import annotations

# Under the lock, each between its ledger lines. `smoke` (the verdict of the runner `stage`
# started) comes before `switch`, or with `smoke.when: beside-load` after `restart`.
STEPS = ("preflight", "baseline", "stage", "render", "measure", "smoke", "switch", "restart", "probes", "gates",
         "commit")

PLAN_TEXT = {"stage": "stage (smoke tests start, detached)", "smoke": "smoke (their verdict)"}
BESIDE_LOAD_TEXT = "smoke (their verdict, beside the engine's load)"


def order(smoke_when: str) -> list[str]:
    """STEPS as a deploy with this `smoke.when` runs them."""
    if smoke_when == "before-switch":
        return list(STEPS)
    rest = [s for s in STEPS if s != "smoke"]
    at = rest.index("restart") + 1
    return [*rest[:at], "smoke", *rest[at:]]


def plan_lines(smoke_when: str) -> list[str]:
    """The steps as --plan shows them: preflight's read-only look, the lock, then order()."""
    beside = smoke_when != "before-switch"
    return ["preflight", "lock", *[(BESIDE_LOAD_TEXT if beside and s == "smoke" else PLAN_TEXT.get(s, s))
                                   for s in order(smoke_when)[1:]]]

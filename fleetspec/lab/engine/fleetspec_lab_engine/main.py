"""Start-up in the order a real SGLang server goes through, each step able to fail as it would."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from fleetspec_lab_engine import args, settings

log = logging.getLogger("fleetspec_lab_engine")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stdout, force=True)
    config = settings.engine()
    log.info("fleetspec lab engine stand-in (no GPU)")

    args.load_plugins()
    parsed = args.parse(argv)            # unknown flag: SystemExit(2) from the real parser
    logging.getLogger().setLevel(logging.INFO)
    settings.ALGORITHM = parsed.algorithm
    faults = settings.faults()
    log.info("sglang %s; speculative algorithm resolved: %s; faults: %s", parsed.version, parsed.algorithm,
             sorted(faults) or "none")
    worker = args.worker_class(parsed)   # imports the worker's modules; a broken one fails here
    parsed.imported = [worker.__module__] if worker is not None else []
    log.info("speculative worker: %s", f"{worker.__module__}.{worker.__qualname__}" if worker else "(none)")

    from fleetspec_lab_engine.engine import Engine
    from fleetspec_lab_engine.server import State, serve

    engine = Engine(parsed, config, worker)
    log.info("decode plan: %s", engine.plan.as_dict())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    settings.bite_at_start(faults, log)       # xid_at_start, crash_at_start (exits 1)
    load = float(faults.get("slow_load", config["load_seconds"]))
    log.info("Load weight begin (%.1f s)", load)
    if settings.wait_stop(stop, load):
        sys.exit(0)
    if faults.get("hang_at_start"):
        log.info("fleetspec-lab fault hang_at_start: never finishing the model load")
        settings.wait_stop(stop)
        sys.exit(0)

    state = State(parsed, engine, config)
    host = parsed.get("host") or "127.0.0.1"
    port = int(parsed.get("port") or 30000)
    httpd = serve(state, host, port)
    log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", host, port)
    if not settings.wait_stop(stop, float(config["warmup_seconds"])):
        state.status, state.up_since = "up", time.monotonic()
        log.info("The server is fired up and ready to roll!")
        settings.wait_stop(stop)

    log.info("Received SIGTERM; draining %d in-flight request(s)", state.inflight)
    with state.cond:
        state.status = "draining"
        deadline = time.monotonic() + float(config["drain_seconds"])
        while state.inflight and time.monotonic() < deadline:
            state.cond.wait(deadline - time.monotonic())
    httpd.shutdown()
    log.info("Shutdown complete")
    logging.shutdown()
    os._exit(0)

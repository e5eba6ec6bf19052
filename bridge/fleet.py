"""Run several workers from one command: one supervisor process per GPU (or N CPU workers).

``cuda-agent worker --service evaluate --gpus 0,1`` starts two supervisors; each sets
``CUDA_VISIBLE_DEVICES`` to its own GPU before it spawns its evaluation child, so every child
sees exactly one device as ``cuda:0`` and no process ever initialises CUDA on a GPU it does not
own. Compile workers get ``CUDA_VISIBLE_DEVICES=""``: compilation never occupies a GPU.

The launcher forwards SIGTERM (drain) to every supervisor and restarts a supervisor that was
killed by a signal; one that exits with an error (e.g. its handler does not load) ends the fleet.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import time

from cuda_agent.contracts import EVALUATOR_HANDLERS

log = logging.getLogger("bridge.fleet")

HANDLERS = EVALUATOR_HANDLERS  # the evaluator's services, by name (the contract module)


def default_handler(service: str) -> str:
    if service not in HANDLERS:
        raise ValueError(f"no default handler for service {service!r}; pass --handler module:function")
    return HANDLERS[service]


def handlers_for(services: list, handler: str | None) -> dict:
    """{service: "module:function"}: the one given for all services, else each service's default."""
    return {s: handler or default_handler(s) for s in services}


def worker_slots(gpus: str | None, count: int) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each worker: one per listed GPU, or ``count`` times ""."""
    if gpus:
        slots = [g.strip() for g in gpus.split(",") if g.strip()]
        if not slots or not all(g.isdigit() for g in slots):
            raise ValueError(f"--gpus must be a comma-separated list of device indices, got {gpus!r}")
        if len(set(slots)) != len(slots):
            raise ValueError(f"--gpus lists a device twice: {gpus!r}")
        return slots
    if count < 1:
        raise ValueError("--count must be at least 1")
    return [""] * count


def _supervisor_main(endpoint, services, handler, settings, gpu, capacity, curve) -> None:
    from bridge.worker import WorkerExit, serve_worker

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker[gpu={gpu or '-'}] %(levelname)s %(message)s")
    try:
        serve_worker(endpoint, services, handler, settings, gpu=gpu, capacity=capacity, curve=curve,
                     drain_on_sigint=False)
    except WorkerExit as exc:
        print(f"worker error: {exc}", file=sys.stderr)
        sys.exit(2)


def run_fleet(endpoint: str, services: list, handler, settings: dict, slots: list, capacity: int = 1,
              curve=None) -> int:
    """Run one supervisor per slot until SIGTERM; returns the exit code for the command."""
    context = multiprocessing.get_context("spawn")
    stopping = False

    def start(gpu):
        proc = context.Process(target=_supervisor_main, args=(endpoint, services, handler, settings, gpu, capacity, curve))
        proc.start()
        return proc

    procs = {i: start(gpu) for i, gpu in enumerate(slots)}

    def drain(*_):
        nonlocal stopping
        stopping = True
        for proc in procs.values():
            if proc.is_alive():
                proc.terminate()

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    code = 0
    while procs:
        time.sleep(0.5)
        for i, proc in list(procs.items()):
            if proc.is_alive():
                continue
            proc.join()
            if not stopping and proc.exitcode is not None and proc.exitcode < 0:
                log.warning("worker for gpu %r killed by signal %d; restarting it", slots[i], -proc.exitcode)
                procs[i] = start(slots[i])
                continue
            del procs[i]
            if proc.exitcode not in (0, None) and not stopping:
                code = proc.exitcode
                drain()
    return code

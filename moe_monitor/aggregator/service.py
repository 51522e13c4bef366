"""The aggregator as a service: one process aggregating one run, or every run of moe:runs as they appear (--all:
in one thread, round-robin, without blocking reads), until stopped. Stopping commits what is buffered and
releases the leases (steps still assembling stay pending in the consumer group for whoever takes over)."""
from __future__ import annotations

import math
import sys
import threading
import time

from moe_monitor import core

from .options import AggregateOptions
from .worker import Aggregator, aggregator_budget, default_consumer

MAX_RUNS = 1024  # runs one --all process aggregates
IDLE_SHARE = 16  # a run no longer written to keeps this fraction of an equal share (service.share_budget)
MMAP_THRESHOLD_BYTES = 1 << 20  # arrays this large are mmapped and go back to the system when freed


def steady_malloc() -> bool:
    """Fix glibc's mmap threshold (its default rises after the first large frees, and the wide steps the
    aggregator frees then stay in a fragmented heap: the process grew with every step of a stalled wide run
    instead of staying within its budget). False where there is no glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, MMAP_THRESHOLD_BYTES))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def serve(redis_url: str, run: str | None, options: AggregateOptions, stop: threading.Event, *,
          consumer: str | None = None, active_s: float = 86_400.0, discover_s: float = 10.0,
          duration_s: float | None = None) -> int:
    """Aggregate run (or, run None, every run of moe:runs written to within active_s, looked for every
    discover_s) until stop is set or duration_s passed. ValueError for a bad URL or run name."""
    steady_malloc()
    client = core.connect(redis_url, timeout_s=options.timeout_s, retries=0)
    if run is not None:
        core.check_run_name(run)
    consumer = consumer or default_consumer()
    budget = aggregator_budget(options.memory_budget_bytes)  # shared by every run, each an equal share
    workers: dict[str, Aggregator] = {}
    end = math.inf if duration_s is None else time.monotonic() + duration_s
    discover_at = -math.inf
    print(f"aggregating {'every run' if run is None else 'run ' + run} of {core.redact(redis_url)} as {consumer}",
          file=sys.stderr, flush=True)
    try:
        while not stop.is_set() and time.monotonic() < end:
            if run is None and time.monotonic() >= discover_at:
                discover_at = time.monotonic() + discover_s
                found = active_runs(client, active_s)
                for name in found:
                    if name not in workers and len(workers) < MAX_RUNS:
                        workers[name] = Aggregator(redis_url, name, options, consumer=consumer, client=client,
                                                   budget=budget)
                share_budget(workers, set(found), budget.total_bytes)
            elif run is not None and not workers:
                workers[run] = Aggregator(redis_url, run, options, consumer=consumer, client=client, budget=budget)
            did = False
            for worker in list(workers.values()):
                did = worker.step() or did
            if not did:
                waits = [w.idle_wait_s() for w in workers.values()] or [0.5]
                stop.wait(min(max(min(waits), 0.01 if run is None else 0.0), 1.0, max(0.0, end - time.monotonic())))
    finally:
        for worker in workers.values():
            worker.close()
        client.close()
    return 0


def share_budget(workers: dict[str, Aggregator], active: set[str], total_bytes: int) -> None:
    """An equal share of the budget for each run written to lately; a run that stopped keeps 1/IDLE_SHARE of
    it (what it still holds drains as its waiting steps are written), so runs that ended never starve live ones."""
    live = [name for name in workers if name in active] or list(workers)
    share = total_bytes // max(1, len(live))
    for name, worker in workers.items():
        want = share if name in live else share // IDLE_SHARE
        if worker.share_bytes != want:
            worker.set_share(want)


def active_runs(client, active_s: float) -> list[str]:
    """Valid run names of moe:runs written to within active_s (newest first); [] when Redis does not answer."""
    try:
        scored = client.zrangebyscore(core.RUNS_KEY, time.time() - active_s, "+inf", withscores=True)
    except core.REDIS_ERRORS as exc:
        print(f"aggregate: cannot list runs at {core.RUNS_KEY} ({type(exc).__name__}: {exc}); trying again",
              file=sys.stderr, flush=True)
        return []
    runs = []
    for name, _score in sorted(scored, key=lambda pair: -pair[1]):
        text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        try:
            runs.append(core.check_run_name(text))
        except ValueError:
            continue
    return runs

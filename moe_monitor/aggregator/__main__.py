"""python -m collectors.aggregate --redis URL (--run NAME | --all) [options]

Sums each step's ranks of a run once into moe:{RUN}:agg and writes its 1 s and 60 s rollups, next to Redis.
Safe to run twice: the second waits as standby and takes over when the first stops renewing its lease.

--all aggregates every run of the moe:runs sorted set (written to within --active-s) and picks up new runs as
they appear (every --discover-s), in one thread, round-robin, without blocking reads. SIGINT / SIGTERM stop
it cleanly: what is buffered is committed and the leases are released (steps still assembling stay pending
in the consumer group for whoever takes over)."""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time

from moe_monitor import core

from .options import AggregateOptions
from .worker import REDIS_ERRORS, Aggregator, default_consumer

MAX_RUNS = 1024  # runs one --all process aggregates
# the AggregateOptions fields that are flags (deadline_s: --deadline-s, of its default's type), in --help order
OPTION_FLAGS = (
    ("deadline_s", "write a step this long after its first rank arrived even if ranks are missing (%(default)s)"),
    ("agg_maxlen", "aggregate stream MAXLEN ~, entries (%(default)s)"),
    ("keep_raw_s", "seconds of per-rank entries kept in the steps stream once consumed (%(default)s)"),
    ("retention_1s_s", "keep 1 s rollups this long, seconds (%(default)s)"),
    ("retention_60s_s", "keep 60 s rollups this long, seconds (%(default)s)"),
    ("lease_s", "lease length: a standby takes over this long after the holder stopped (%(default)s)"),
    ("read_count", "entries per read (%(default)s)"),
    ("block_ms", "XREADGROUP BLOCK with --run (%(default)s; --all never blocks)"),
    ("timeout_s", "Redis socket timeout (%(default)s)"),
    ("log_every_s", "seconds between progress lines"),
)


def _parser() -> argparse.ArgumentParser:
    d = AggregateOptions()
    p = argparse.ArgumentParser(prog="python -m collectors.aggregate", description=(__doc__ or "").split("\n\n")[1],
                                epilog=(__doc__ or "").split("\n\n")[2])
    p.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="redis://, rediss:// or unix:// URL (default: $REDIS_URL or redis://127.0.0.1:6379/0)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="the run to aggregate")
    which.add_argument("--all", action="store_true", help="every run of moe:runs, new ones as they appear")
    for name, text in OPTION_FLAGS:
        default = getattr(d, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=text)
    p.add_argument("--consumer", default=None, help="consumer name (default: host-pid-random)")
    p.add_argument("--active-s", type=float, default=86_400.0,
                   help="--all: runs written to within this many seconds (%(default)s)")
    p.add_argument("--discover-s", type=float, default=10.0, help="--all: seconds between looks at moe:runs")
    p.add_argument("--duration-s", type=float, default=None, help="stop after this many seconds (tests, benchmarks)")
    return p


def main(argv: list[str] | None = None, stop: threading.Event | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        flags = {name: getattr(args, name) for name, _ in OPTION_FLAGS}
        options = AggregateOptions(**{**flags, "block_ms": 0 if args.all else args.block_ms})
        client = core.connect(args.redis, timeout_s=options.timeout_s, retries=0)
        if args.run is not None:
            core.check_run_name(args.run)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    consumer = args.consumer or default_consumer()
    workers: dict[str, Aggregator] = {}
    end = math.inf if args.duration_s is None else time.monotonic() + args.duration_s
    discover_at = -math.inf
    print(f"aggregating {'every run' if args.all else 'run ' + args.run} of {core.redact(args.redis)} as {consumer}",
          file=sys.stderr, flush=True)
    try:
        while not stop.is_set() and time.monotonic() < end:
            if args.all and time.monotonic() >= discover_at:
                discover_at = time.monotonic() + args.discover_s
                for run in _active_runs(client, args.active_s):
                    if run not in workers and len(workers) < MAX_RUNS:
                        workers[run] = Aggregator(args.redis, run, options, consumer=consumer, client=client)
            elif args.run is not None and not workers:
                workers[args.run] = Aggregator(args.redis, args.run, options, consumer=consumer, client=client)
            did = False
            for worker in list(workers.values()):
                did = worker.step() or did
            if not did:
                waits = [w.idle_wait_s() for w in workers.values()] or [0.5]
                stop.wait(min(max(min(waits), 0.01 if args.all else 0.0), 1.0, max(0.0, end - time.monotonic())))
    finally:
        for worker in workers.values():
            worker.close()
        client.close()
    return 0


def _active_runs(client, active_s: float) -> list[str]:
    """Valid run names of moe:runs written to within active_s (newest first); [] when Redis does not answer."""
    try:
        scored = client.zrangebyscore(core.RUNS_KEY, time.time() - active_s, "+inf", withscores=True)
    except REDIS_ERRORS as exc:
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


if __name__ == "__main__":
    sys.exit(main())

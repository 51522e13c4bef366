"""moe-monitor aggregate --redis URL (--run NAME | --all): sum each step's ranks of a run once into
moe:{RUN}:agg and write its 1 s and 60 s rollups, next to Redis. Safe to run twice: the second waits as standby
and takes over when the first stops renewing its lease. SIGINT / SIGTERM stop it cleanly."""
from __future__ import annotations

import argparse
import signal
import threading

from .common import add_redis, guarded

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


def register(sub) -> None:
    from moe_monitor.aggregator.options import AggregateOptions
    d = AggregateOptions()
    p = sub.add_parser("aggregate", help="sum each step's ranks once; 1 s / 60 s rollups (for many ranks)",
                       description=(__doc__ or "").split(":", 1)[1].strip())
    add_redis(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", metavar="NAME", help="the run to aggregate")
    which.add_argument("--all", action="store_true", help="every run of moe:runs, new ones as they appear")
    for name, text in OPTION_FLAGS:
        default = getattr(d, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=text)
    p.add_argument("--memory-budget", metavar="SIZE", default=None,
                   help="memory every run's waiting steps, held records and open rollup seconds share, e.g. 1GiB "
                        f"(default: {d.memory_budget_bytes >> 30}GiB)")
    p.add_argument("--consumer", default=None, help="consumer name (default: host-pid-random)")
    p.add_argument("--active-s", type=float, default=86_400.0,
                   help="--all: runs written to within this many seconds (%(default)s)")
    p.add_argument("--discover-s", type=float, default=10.0, help="--all: seconds between looks at moe:runs")
    p.add_argument("--duration-s", type=float, default=None, help="stop after this many seconds (tests, benchmarks)")
    p.set_defaults(handler=lambda args: guarded(aggregate, args))


def aggregate(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    from moe_monitor.aggregator.options import AggregateOptions
    from moe_monitor.aggregator.service import serve
    from moe_monitor.core.membudget import parse_bytes
    flags = {name: getattr(args, name) for name, _ in OPTION_FLAGS}
    if getattr(args, "memory_budget", None):
        flags["memory_budget_bytes"] = parse_bytes(args.memory_budget, "--memory-budget")
    options = AggregateOptions(**{**flags, "block_ms": 0 if args.all else args.block_ms})
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    return serve(args.redis, None if args.all else args.run, options, stop, consumer=args.consumer,
                 active_s=args.active_s, discover_s=args.discover_s, duration_s=args.duration_s)

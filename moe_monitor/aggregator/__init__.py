"""The aggregator: `moe-monitor aggregate --redis URL (--run NAME | --all)`, a process anyone can run next to
Redis. It sums each step's ranks once (core.assembly, so no dashboard has to), writes 1 s and 60 s rollups, and
is safe to run twice (a lease; a successor takes over from the consumer group's pending entries). In-process:
`Aggregator(url, run, AggregateOptions(...))`, then `step()` / `run_until()`, `stats()`.

Pure parts: layoutbook.py, rollup.py, progress.py; Redis I/O: worker.py (one run's rounds), reading.py,
commit.py, lease.py, takeover.py; service.py runs one run or all. Redis design, rollups, lease and takeover,
memory and throughput: docs/scaling.md ("When to run the aggregator", "Inside the aggregator").
"""
from __future__ import annotations

from moe_monitor.core.assembly import Assembler, Counters, Emitted, Output

from .layoutbook import LayoutBook
from .options import GROUP, AggregateOptions
from .rollup import RollupBuilder, RollupCounters, bucket_rollup
from .worker import Aggregator

__all__ = ["GROUP", "AggregateOptions", "Aggregator", "Assembler", "Counters", "Emitted", "LayoutBook", "Output",
           "RollupBuilder", "RollupCounters", "bucket_rollup"]

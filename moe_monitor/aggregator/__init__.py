"""The aggregator: `moe-monitor aggregate --redis URL (--run NAME | --all)`, a process anyone can run next
to Redis. It sums each step's ranks once (so no dashboard has to), writes hours of rollups, and is safe to run
twice. In-process: `Aggregator(url, run, AggregateOptions(...))`, then `step()` / `run_until()`, `stats()`.

Files: assembly.py (pure: per-step buckets, completion, late ranks, duplicates, epochs), layoutbook.py (pure:
the layout in force at each step), rollup.py (pure: 1 s and 60 s buckets), progress.py (pure: the progress
hash), lease.py (the lease and its Lua scripts), takeover.py (what a new holder reads), worker.py (the Redis
I/O of one run: Aggregator, its rounds and state), reading.py (a round's pipelined reads and their decoding),
commit.py (the outbox and the MULTI/EXEC commit), options.py (the knobs), __main__.py (the CLI, --all).

Redis design (every key is one run's, moe:{RUN}:..., so one hash slot in a Cluster; every transaction and
script touches one run's keys only):

- Input: the run's steps stream (core.steps_key), read in the consumer group "moe-aggregate" (XGROUP CREATE
  ... 0 MKSTREAM: from the start of what is there), XREADGROUP COUNT --read-count (512) with a short BLOCK
  (100 ms; none with --all), pipelined behind an XRANGE of the layouts stream so a step never arrives before
  the layout change its collector wrote first. Entries are decoded with core.decode_step; one that does not
  decode (or names another run) is acked, counted (bad_records) and reported in one line per log interval.
- Assembly (assembly.py): a step is written once all ranks of its world arrived, or --deadline-s (2 s) after
  its first record arrived here (monotonic clock, not record times), with the missing ranks named in the
  record's rank mask and counted. Late ranks become a late entry holding only them; duplicates are skipped
  and counted; a collector restart (a rank's instance changes) opens a new epoch (AggregateRecord.instance),
  after the old epoch's pending steps are written.
- Output: XADD core.aggregate_key(run) MAXLEN ~ --agg-maxlen (4096). Each commit is one MULTI/EXEC under
  WATCH of the lease key: the aggregates, the rollups that closed, the XACKs of every step entry they (or
  the duplicates, bad and stale records) consumed, the progress hash and the lease's PEXPIRE. An entry is
  acked only with the aggregate that consumed it, so the group's pending list holds exactly the entries of
  steps not yet written. The WATCH fences a holder that stalled past its lease: its EXEC fails and it goes
  back to standby. (The transaction uses redis-py's own pipeline of the client core.connect decided, single
  or cluster: WATCH needs commands that answer at once, which a batching pipeline does not give.)
- Rollups (rollup.py): XADD core.rollup_key(run, 1 | 60) with the explicit id `<bucket start ms>-0` (Redis
  refuses a second write of a bucket: idempotent) and MINID (exact) = start - retention (--retention-1s-s
  900, --retention-60s-s 86400). A bucket closes once aggregated steps are --deadline-s + 1 s past its end,
  or the wall clock is and nothing arrived for it that long, and no step still assembling could fall in it; a
  minute is the merge of its seconds.
- Lease (lease.py): SET core.aggregator_key(run) <consumer> NX PX --lease-s (5 s), renewed every third of
  it (and by every commit) with a compare-and-renew Lua script, released with compare-and-delete. A second
  aggregator waits as standby (one SET NX a second) and takes over when the lease expires. Consumer names
  (--consumer; default host-pid-random) must differ between aggregators: the lease compares them.
- Takeover (takeover.py): the new holder reads the progress hash (counters, epoch, collector instances,
  retired ones), the tail of the aggregate stream (up to --agg-maxlen entries of the epoch: which steps and
  ranks were written, so no step is written twice; steps below the highest of the oldest quarter count as
  forgotten), the newest rollup id of each resolution (older buckets are not written again) and the whole
  layouts stream; it replays the aggregates of the minute not yet rolled up into its rollups, then
  XAUTOCLAIMs every pending entry of the group (the dead holder's) and assembles them like new ones. Later,
  every --lease-s, entries another consumer left idle for two leases are XCLAIMed (XPENDING IDLE).
- Raw stream kept short: about once a second, XTRIM MINID ~ to keep the last --keep-raw-s (5 s) behind the
  newest entry read, never past an entry still waiting for its step (hence never past the group's last
  delivered id).
- Progress/health (progress.py): the hash core.aggregator_key(run) + ":state", written by every commit:
  steps_written, rank_steps_missing, late_records, late_ranks, duplicates, bad_records, stale_records,
  too_old, epochs, rollup counters, epoch, last_step, pending_steps, lag_entries (XINFO GROUPS lag; -1 when
  Redis cannot tell), entries_per_s, consumer, time_s, commit, last_problem, and (every 2 s or on change)
  instances and retired; plus a progress line on stderr every --log-every-s (5 s).
- Redis down or a command refused: one message (again every 30 s while it lasts), exponential backoff up to
  5 s, and everything buffered (aggregates not committed, steps assembling) stays in memory; a commit whose
  EXEC may or may not have run is checked by its tag in the progress hash before it is sent again. A Redis
  that comes back empty gets its consumer group and lease back (the lease script tells an emptied Redis from
  a successor).

Memory in Redis (MEMORY USAGE of real streams on redis-server 7.0; DeepSeek-V3's 58 MoE layers x 256 experts at
256 ranks x 64 decode tokens x top-8 x 20 steps/s, popularity of the real DeepSeek-V3 decode counts in
tests/data; `python -m bench.aggregate_ceiling` measures it again): a 1 s bucket sums 20 steps (counts up
to ~1e5 per expert: int32, zstd) and takes 41.5 kB, so the default 15 min of 1 s rollups (900 buckets) take 36 MiB (1 h: 142 MiB); a 60 s
bucket takes 49.7 kB, so 24 h of 60 s rollups (1,440 buckets) takes 68 MiB; the aggregate stream takes 21 kB
an entry, 82 MiB at its default 4,096 entries. The raw steps kept behind the aggregator (--keep-raw-s 5) are
~6 kB an entry: 5 s x 5,120 entries/s is ~150 MB (the collectors' own MAXLEN budget trims first otherwise).

Throughput (same self-benchmark, 2-core machine, redis-server and the writer on it too): one aggregator drains a
backlog at 12,900-14,900 entries/s (60-71 ms of CPU per 1,000 entries, three quarters of it core.decode_step,
mostly its zstd) and keeps up with a writer at 5,120 entries/s (256 ranks x 20 steps/s; no step behind when the
writer stops) using 34-35% of one core, redis-server ~9%.
"""
from __future__ import annotations

from moe_monitor.core.assembly import Assembler, Counters, Emitted, Output
from .layoutbook import LayoutBook
from .options import GROUP, AggregateOptions
from .rollup import RollupBuilder, RollupCounters, bucket_rollup
from .worker import Aggregator

__all__ = ["GROUP", "AggregateOptions", "Aggregator", "Assembler", "Counters", "Emitted", "LayoutBook", "Output",
           "RollupBuilder", "RollupCounters", "bucket_rollup"]

"""moe-monitor record --redis URL --run NAME --out FILE: drain a live run from Redis into a trace (.parquet
archive or .arrows recording), until --steps steps, --seconds seconds, or Ctrl-C / SIGTERM. A run the aggregator
sums is recorded from its aggregate stream, one row per step."""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from moe_monitor import core

from .common import StopSignal, add_redis, add_run, guarded


def register(sub) -> None:
    rec = sub.add_parser("record", help="drain a live run from Redis into a trace",
                         description=(__doc__ or "").split("\n\n")[0])
    add_redis(rec)
    add_run(rec)
    rec.add_argument("--out", required=True, metavar="FILE", help=".parquet (archive) or .arrows (recording)")
    rec.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    rec.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    rec.set_defaults(handler=lambda args: guarded(record, args))


def record(args: argparse.Namespace) -> int:
    from moe_monitor.core.tracefile.writers import open_writer
    from moe_monitor.dashboard.sources.redis import RedisSource  # the dashboard's own reader of a live run
    if args.steps < 0 or args.seconds < 0 or not math.isfinite(args.seconds):
        raise ValueError("--steps and --seconds must be >= 0")
    if not args.out.lower().endswith((".parquet", ".arrows")):
        raise ValueError(f"{args.out}: --out must end in .parquet or .arrows")
    core.check_run_name(args.run)
    client = core.connect(args.redis, timeout_s=5.0)
    client.ping()
    source = RedisSource(client, args.redis, args.run, 1000)
    stop = StopSignal()
    deadline = time.monotonic() + args.seconds if args.seconds else math.inf
    writer = None
    pending: list[core.StepRecord] = []
    steps_seen: set[int] = set()
    idle_since = time.monotonic()
    bad = skipped_late = 0
    try:
        while not stop.stop and time.monotonic() < deadline:
            batch = source.poll(2000)
            bad += batch.bad_records
            meta = source.meta()
            if meta is None:
                if time.monotonic() - idle_since > 10 and not batch.steps:
                    raise ValueError(f"run {args.run!r} has no metadata in Redis")
                time.sleep(0.2)
                continue
            if writer is None:
                writer = open_writer(args.out, meta, [])
            writer.add_layouts([rec for rec in batch.layouts if _fits(rec, meta)])
            merged, late = merge_aggregates(pending, batch.aggregates, steps_seen)
            skipped_late += late
            records = merged + batch.steps
            if args.steps:
                allowed = set(sorted(steps_seen | {r.step for r in records})[:args.steps])
                records = [r for r in records if r.step in allowed]
            newest = max((r.step for r in records), default=None)
            pending = [r for r in records if r.step == newest]  # more ranks of it may come with the next poll
            timings = [t for t in batch.timings if np.shape(t.layer_s_L) == (len(meta.layer_names),)]
            bad += len(batch.timings) - len(timings)  # timings of another layer count than the run's
            if args.steps:
                timings = [t for t in timings if t.step in allowed]
            writer.write(sorted((r for r in records if r.step != newest), key=lambda r: (r.step, r.rank)),
                         batch.gpu_samples, timings)
            steps_seen.update(r.step for r in records)
            if args.steps and len(steps_seen) >= args.steps:
                break
            if not batch.more:
                time.sleep(0.1)
        if writer is not None and pending:
            writer.write(pending)
    finally:
        if writer is not None:
            writer.close()
        client.close()
    if writer is None:
        raise ValueError(f"run {args.run!r}: nothing recorded (no metadata in Redis)")
    print(f"recorded {len(steps_seen)} steps of run {args.run} into {args.out}" + (f" ({bad} bad records skipped)" if bad else "")
          + (f" ({skipped_late} late ranks left out: their steps were written before they came)" if skipped_late else ""))
    return 0


def merge_aggregates(pending: list[core.StepRecord], aggregates: list[core.AggregateRecord],
                      written: set[int]) -> tuple[list[core.StepRecord], int]:
    """pending rows + a poll's aggregated steps (the aggregator's: the ranks already summed) -> trace rows, one
    per aggregated step (rank 0 of world 1, tokens and dropped steps summed over its ranks, the aggregator's epoch
    as instance), entries of one step (a late rank folded in) merged into one row; and how many late ranks were
    left out because their step was written already (or their sum would not fit a row's int32 counts)."""
    rows = {(r.step, r.rank): r for r in pending}
    left_out = 0
    for agg in aggregates:
        if agg.step in written and (agg.step, 0) not in rows:
            left_out += int(agg.ranks_R.size)
            continue
        before = rows.get((agg.step, 0))
        counts = agg.counts_LE if before is None else agg.counts_LE + before.counts_LE
        if counts.max(initial=0) > np.iinfo(np.int32).max:  # a trace row holds int32 counts
            left_out += int(agg.ranks_R.size)
            continue
        rows[(agg.step, 0)] = core.StepRecord(
            run=agg.run, rank=0, world_size=1, step=agg.step, time_s=max(agg.time_s, before.time_s if before else 0.0),
            phase=agg.phase if before is None or before.phase == agg.phase else "mixed",
            tokens=agg.tokens + (before.tokens if before else 0), counts_LE=counts.astype(np.int32),
            dropped_steps=int(agg.dropped_R.sum()) + (before.dropped_steps if before else 0),
            instance=agg.instance, scope=agg.scope)
    return list(rows.values()), left_out


def _fits(rec: core.LayoutRecord, meta: core.RunMeta) -> bool:
    try:
        rec.validate(meta.num_experts, num_layers=len(meta.layer_names), unused=True)
    except ValueError:
        return False
    return True

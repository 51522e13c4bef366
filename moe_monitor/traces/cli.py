"""python -m traces record|replay|convert|info: record a live run from Redis into a trace, replay a trace into
Redis as a live run, convert traces and SGLang dumps, describe a trace. Bad input: one `error:` line, exit 2.

    python -m traces record --redis URL --run NAME --out FILE.parquet|.arrows [--steps N | --seconds S]
    python -m traces replay --trace FILE --redis URL --run NAME [--speed X] [--loop]
    python -m traces convert IN OUT [--run NAME] [--gpus G] [--phase P] [--top-k K]
    python -m traces info FILE
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import sys
import time

import numpy as np

from moe_monitor import core


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m traces", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="drain a live run from Redis into a trace")
    rec.add_argument("--redis", required=True)
    rec.add_argument("--run", required=True)
    rec.add_argument("--out", required=True, help=".parquet (archive) or .arrows (recording)")
    rec.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    rec.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    rep = sub.add_parser("replay", help="publish a trace into Redis as a live run")
    rep.add_argument("--trace", required=True)
    rep.add_argument("--redis", required=True)
    rep.add_argument("--run", required=True)
    rep.add_argument("--speed", type=float, default=1.0, help="x the recorded pace (time_s gaps)")
    rep.add_argument("--loop", action="store_true", help="start again at the end (step ids continue)")
    rep.add_argument("--max-loops", type=int, default=0, help=argparse.SUPPRESS)
    con = sub.add_parser("convert", help="JSON lines, SGLang dumps (.pt) or logical_count JSON -> .parquet/.arrows")
    con.add_argument("src", metavar="IN")
    con.add_argument("dst", metavar="OUT")
    con.add_argument("--run", default=None, help="run name of the output (default: the input's)")
    con.add_argument("--gpus", type=int, default=None, help="GPUs of the layout (SGLang inputs)")
    con.add_argument("--phase", default="unknown", help="phase of logical_count JSON steps")
    con.add_argument("--top-k", type=int, default=8, help="k of the model (SGLang inputs without ids)")
    inf = sub.add_parser("info", help="steps, ranks, time span, layouts, size")
    inf.add_argument("path", metavar="FILE")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "info":
            return _info(args.path)
        if args.command == "convert":
            from .convert import convert
            steps = convert(args.src, args.dst, run=args.run, gpus=args.gpus, phase=args.phase, top_k=args.top_k)
            print(f"wrote {args.dst}: {steps} steps")
            return 0
        if args.command == "record":
            return _record(args)
        return _replay(args)
    except ValueError as exc:
        print(f"error: {str(exc).splitlines()[0] if str(exc) else 'bad input'}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a Redis that is down or refuses: one line, not a traceback
        if type(exc).__module__.startswith("redis"):
            print(f"error: Redis: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
            return 2
        raise


def _info(path: str) -> int:
    from .reader import open_trace
    with open_trace(path) as reader:
        info = reader.info()
        meta = reader.meta
    print(f"{info.path}: {info.container}")
    print(f"run {meta.run}: {meta.model_name}, {len(meta.layer_names)} layers x {meta.num_experts} experts, "
          f"top-{meta.top_k}, {meta.layout.gpus} GPUs")
    print(f"steps {info.steps} ({info.first_step}..{info.last_step}), ranks {info.ranks}, "
          f"time span {info.span_s:.1f} s")
    print(f"layout records {info.layouts}, NVML samples {info.gpu_samples}, layer timing rows {info.timings}, "
          f"size {info.size_bytes} bytes")
    if info.bad_records or info.truncated:
        print(f"bad records {info.bad_records}{', truncated (a recording cut short)' if info.truncated else ''}")
    return 0


class _Stop:
    def __init__(self) -> None:
        self.stop = False
        signal.signal(signal.SIGINT, self._set)
        signal.signal(signal.SIGTERM, self._set)

    def _set(self, *_):
        self.stop = True


def _record(args) -> int:
    from moe_monitor.dashboard.sources.redis import (
        RedisSource,  # the dashboard's own reader of a live run (no streamlit)
    )

    from .writers import open_writer
    if args.steps < 0 or args.seconds < 0 or not math.isfinite(args.seconds):
        raise ValueError("--steps and --seconds must be >= 0")
    if not args.out.lower().endswith((".parquet", ".arrows")):
        raise ValueError(f"{args.out}: --out must end in .parquet or .arrows")
    core.check_run_name(args.run)
    client = core.connect(args.redis, timeout_s=5.0)
    client.ping()
    source = RedisSource(client, args.redis, args.run, 1000)
    stop = _Stop()
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
            merged, late = _merge_aggregates(pending, batch.aggregates, steps_seen)
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


def _merge_aggregates(pending: list[core.StepRecord], aggregates: list[core.AggregateRecord],
                      written: set[int]) -> tuple[list[core.StepRecord], int]:
    """pending rows + a poll's aggregated steps (collectors.aggregate: the ranks already summed) -> trace rows, one
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
        rec.validate(meta.num_experts, num_layers=len(meta.layer_names))
    except ValueError:
        return False
    return True


def _replay(args) -> int:
    from .cursor import Cursor
    from .publish import RunPublisher
    from .reader import open_trace
    if not (math.isfinite(args.speed) and args.speed > 0):
        raise ValueError("--speed must be a positive number")
    core.check_run_name(args.run)
    core.connect(args.redis).close()  # the URL's form, before anything is read (connecting is lazy)
    reader = open_trace(args.trace)
    meta = dataclasses.replace(reader.meta, run=args.run, instance=core.new_instance_id(), started_s=time.time())
    timeline = reader.timeline()
    if timeline.num_steps == 0:
        raise ValueError(f"{args.trace}: holds no step")
    publisher = RunPublisher(args.redis, meta)
    stop = _Stop()
    span_steps = int(timeline.step_T[-1] - timeline.step_T[0]) + 1
    loop, published = 0, 0
    wall0 = time.time()
    t_first = float(timeline.time_s_T[0])
    loop_offset_s = 0.0
    try:
        while not stop.stop:
            instance = core.new_instance_id()
            step_shift = loop * span_steps - int(timeline.step_T[0])
            cursor = Cursor(reader)
            while not cursor.done and not stop.stop:
                chunk = cursor.next_chunk(64)
                by_step: dict[int, list[core.StepRecord]] = {}
                for rec in chunk.steps:
                    by_step.setdefault(rec.step, []).append(rec)
                timed: dict[int, list[core.TimingRecord]] = {}
                for timing in chunk.timings:
                    timed.setdefault(timing.step, []).append(timing)
                layouts = [dataclasses.replace(r, run=args.run, instance=instance, step=max(0, r.step + step_shift),
                                               time_s=wall0 + (loop_offset_s + max(0.0, r.time_s - t_first)) / args.speed)
                           for r in chunk.layouts]
                samples = [dataclasses.replace(s, time_s=wall0 + (loop_offset_s + s.time_s - t_first) / args.speed)
                           for s in chunk.gpu_samples]
                for step, records in by_step.items():
                    when = wall0 + (loop_offset_s + records[0].time_s - t_first) / args.speed
                    delay = when - time.time()
                    if delay > 0:
                        time.sleep(min(delay, 60.0))
                    if stop.stop:
                        break
                    out = [dataclasses.replace(r, run=args.run, instance=instance, step=step + step_shift,
                                               time_s=max(when, 0.0)) for r in records]
                    times = [dataclasses.replace(t, run=args.run, instance=instance, step=step + step_shift,
                                                 time_s=max(when, 0.0)) for t in timed.get(step, [])]
                    publisher.publish(out, layouts, samples, now_s=time.time(), timings=times)
                    layouts, samples = [], []
                    published += 1
                if layouts or samples:
                    publisher.publish([], layouts, samples, now_s=time.time())
            loop += 1
            loop_offset_s += timeline.span_s + (timeline.span_s / max(1, timeline.num_steps - 1))
            if not args.loop or (args.max_loops and loop >= args.max_loops):
                break
    finally:
        publisher.close()
        reader.close()
    print(f"replayed {published} steps of {args.trace} into run {args.run} ({loop} pass{'es' if loop != 1 else ''})")
    return 0

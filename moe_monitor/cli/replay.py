"""moe-monitor replay --trace FILE --redis URL --run NAME: publish a trace into Redis as a live run, at the
recorded pace times --speed, once or --loop (step ids continue), so the dashboard, the exporter and the
aggregator watch it as they would a model. The physical counts of its sidecar (an UltraEP import's post loads)
go with their steps, on moe:{R}:physical."""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

from moe_monitor import core

from .common import StopSignal, add_redis, add_run, add_trace, guarded


def register(sub) -> None:
    rep = sub.add_parser("replay", help="publish a trace into Redis as a live run",
                         description=(__doc__ or "").split("\n\n")[0])
    add_trace(rep, "the trace to publish (.parquet, .arrows or JSON lines)")
    add_redis(rep)
    add_run(rep, help="run name to publish as")
    rep.add_argument("--speed", type=float, default=1.0, help="x the recorded pace (time_s gaps)")
    rep.add_argument("--loop", action="store_true", help="start again at the end (step ids continue)")
    rep.add_argument("--max-loops", type=int, default=0, help=argparse.SUPPRESS)
    rep.set_defaults(handler=lambda args: guarded(replay, args))


def replay(args: argparse.Namespace) -> int:
    from moe_monitor.core.tracefile import open_trace
    from moe_monitor.traces.cursor import Cursor
    from moe_monitor.traces.publish import RunPublisher
    if not (math.isfinite(args.speed) and args.speed > 0):
        raise ValueError("--speed must be a positive number")
    core.check_run_name(args.run)
    core.connect(args.redis).close()  # the URL's form, before anything is read (connecting is lazy)
    reader = open_trace(args.trace)
    physical_by_step = _physical_by_step(args.trace, reader.meta.run)
    meta = dataclasses.replace(reader.meta, run=args.run, instance=core.new_instance_id(), started_s=time.time())
    timeline = reader.timeline()
    if timeline.num_steps == 0:
        raise ValueError(f"{args.trace}: holds no step")
    publisher = RunPublisher(args.redis, meta)
    stop = StopSignal()
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
                    phys = [dataclasses.replace(p, run=args.run, instance=instance, step=step + step_shift,
                                                time_s=max(when, 0.0)) for p in physical_by_step.get(step, [])]
                    publisher.publish(out, layouts, samples, now_s=time.time(), timings=times, physical=phys)
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


def _physical_by_step(trace: str, run: str) -> dict[int, list[core.PhysicalRecord]]:
    """The trace's physical records (its .physical.parquet sidecar, core/tracefile/side.py; none: {}) by
    step; bad rows are said once on stderr and left out."""
    from moe_monitor.core.budget import decoded_budget_bytes
    from moe_monitor.core.tracefile.side import read_physical
    found = read_physical(trace, run, decoded_budget_bytes())
    if found.bad_records:
        print(f"{trace}: {found.bad_records} physical record(s) left out: {found.last_error}", file=sys.stderr)
    by_step: dict[int, list[core.PhysicalRecord]] = {}
    for rec in found.records:
        by_step.setdefault(rec.step, []).append(rec)
    return by_step

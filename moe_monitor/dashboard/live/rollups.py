"""Hours of history: a run watched at a rollup resolution (1 s or 60 s buckets written by the aggregator), pure
(no Streamlit).

RollupRun is a RunView whose window is a BucketWindow over the newest span, so every page analyses it as it
analyses steps. It rides on the live WatchedRun of the same run, which keeps polling its source (metadata,
health, layouts, NVML, timings, routing rows and notes are the live run's): tick the live run first, then the
RollupRun. Layout changes are dated by time: each is in force from the bucket that holds its time.
resolution_line() says which resolution a page shows ("1-minute rollups: last 6 h, 360 buckets of 7,200 steps").
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.live.buckets import BucketWindow
from moe_monitor.dashboard.live.layout_changes import LayoutHistory
from moe_monitor.dashboard.live.snapshot import bucket_name
from moe_monitor.dashboard.live.watched import AGGREGATE, RunNotes, TickStats, WatchedRun
from moe_monitor.dashboard.sources.rollups import RollupBatch, RollupSource


class RollupRun:
    """The rollup buckets of the newest source.span_s seconds of a run, beside its live WatchedRun (see the
    module docstring): a RunView whose window is a BucketWindow and whose layouts are dated by time; the rest
    (source, NVML history, sampled rows, timings, world size) is the live run's. rollups_read: buckets taken;
    rollup_bad: bucket entries skipped; read_error: why the rollup stream could not be read at the last tick."""

    def __init__(self, live: WatchedRun, source: RollupSource):
        self.live = live
        self.rollups = source
        self.window_steps = max(1, source.buckets)
        self.max_entries_per_tick = source.max_entries
        self.window: BucketWindow | None = None
        self.resolution_s = source.resolution_s
        self.span_s = source.span_s
        self.rollups_read = 0
        self.rollup_bad = 0
        self.rollup_error = ""
        self.read_error = ""
        self.last_tick: TickStats | None = None
        self._layouts = LayoutHistory()
        self._layouts_of: tuple[int, int, int] | None = None  # (id, length, newest key) of the history mapped last

    # what the live run keeps (the pages read it from here too)
    source = property(lambda self: self.live.source)
    gpus = property(lambda self: self.live.gpus)
    samples = property(lambda self: self.live.samples)
    timings = property(lambda self: self.live.timings)
    world_size = property(lambda self: self.live.world_size)
    dropped_steps = property(lambda self: self.live.dropped_steps)

    def tick(self) -> TickStats:
        """Read the rollup stream once (never blocking beyond one bounded read) and fold the buckets in."""
        started = time.perf_counter()
        try:
            batch = self.rollups.poll()
            self.read_error = ""
        except Exception as exc:  # Redis down or refusing: the live run's health says so; nothing is lost
            batch, self.read_error = RollupBatch(), core.why(exc)
        if batch.last_error:  # read before the buckets below were folded in
            self.rollup_error = batch.last_error
        refused = 0
        for rec in batch.rollups:
            try:
                self._bucket_window(rec).add_bucket(rec)  # changes nothing when it raises
                self.rollups_read += 1
            except Exception as exc:  # one bad record; the read goes on
                refused += 1
                self.rollup_error = f"rollup bucket at {getattr(rec, 'start_s', '?')} s: {core.why(exc)}"
        self.rollup_bad += batch.bad_records + refused
        self.last_tick = TickStats(steps_in=0, gpu_in=0, bad=batch.bad_records + refused, more=batch.more,
                                   ms=(time.perf_counter() - started) * 1e3)
        return self.last_tick

    def _bucket_window(self, rec: core.RollupRecord) -> BucketWindow:
        if self.window is not None:
            return self.window
        meta = self.source.meta()
        num_layers, num_experts = np.shape(rec.counts_LE)
        if meta is not None and (len(meta.layer_names), meta.num_experts) != (num_layers, num_experts):
            raise ValueError(f"counts are [{num_layers}, {num_experts}] but the run metadata says "
                             f"[{len(meta.layer_names)}, {meta.num_experts}]")
        self.window = BucketWindow(self.window_steps, num_layers, num_experts, self.resolution_s)
        return self.window

    @property
    def layouts(self) -> LayoutHistory:
        """The live run's layout changes, each dated by the bucket its issue time falls in."""
        live = self.live.layouts
        held = (id(live), len(live), live.changes[-1].key if len(live) else 0)
        if held != self._layouts_of:
            self._layouts = timed_layouts(live, self.resolution_s)
            self._layouts_of = held
        return self._layouts

    def notes(self) -> RunNotes:
        """The live run's notes with the rollups' own (bad buckets added, the latest error theirs when they have
        one); no restart note: the rollups go on across collector restarts (time, not step ids, orders them)."""
        live = self.live.notes()
        return dataclasses.replace(live, bad_records=live.bad_records + self.rollup_bad,
                                   last_error=self.rollup_error or live.last_error, restart_note="",
                                   rollups_read=self.rollups_read, read_error=self.read_error)

    def resolution_line(self) -> str:
        """'1-minute rollups: last 6 h, 360 buckets of 7,200 steps' (the buckets held now)."""
        window = self.window
        rows = window.ordered_slots() if window is not None else np.zeros(0, dtype=np.int64)
        steps = int(window.steps_C[rows].sum()) if window is not None else 0
        return (f"{bucket_name(self.resolution_s)} rollups: last {span_text(self.span_s)}, {rows.size:,} "
                f"bucket{'' if rows.size == 1 else 's'} of {steps:,} step{'' if steps == 1 else 's'}")


def timed_layouts(history: LayoutHistory, resolution_s: int) -> LayoutHistory:
    """The changes of history dated by the bucket their issue time falls in: each change's step becomes the start
    (unix s) of the resolution_s bucket holding change.time_s (a change without a time is left out)."""
    out = LayoutHistory(history.max_changes)
    for change in history.changes:
        if change.time_s is None:
            continue
        start = int(change.time_s // resolution_s) * int(resolution_s)
        out.add(dataclasses.replace(change, step=max(0, start)))
    return out


def span_text(span_s: int) -> str:
    """A span as the sidebar chose it: '6 h', '90 min', '45 s'."""
    span_s = int(span_s)
    if span_s >= 3600 and span_s % 3600 == 0:
        return f"{span_s // 3600} h"
    if span_s >= 60 and span_s % 60 == 0:
        return f"{span_s // 60} min"
    return f"{span_s} s"


def full_resolution_line(watched: WatchedRun, window_steps: int) -> str:
    """'full resolution: last 600 steps', saying who summed the ranks when the aggregator did."""
    who = " (ranks summed by the aggregator)" if watched.feed == AGGREGATE else ""
    return f"full resolution: last {window_steps:,} steps{who}"

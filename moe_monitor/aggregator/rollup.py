"""1 s and 60 s rollups (core.RollupRecord) of a run's aggregated steps, built by the aggregator's commit side.
Pure: no I/O; the caller passes its monotonic clock (now_s) and the wall clock (wall_s, unix seconds).

RollupBuilder.add() takes AggregateRecords; close_due() returns the buckets that closed, in order: summed counts
and, per step and layer, the GPU loads under the layout in force (LayoutBook), their balancedness histogram and
the busiest GPU's load. A minute is the merge (core.merge_rollups) of its seconds. Buckets at or before
already_written() are built but not emitted (a predecessor wrote them). When a bucket closes, late steps and
ranks: docs/scaling.md, "Inside the aggregator".

Shape legend: L layers, E logical experts, G GPUs, T steps, B = core.ETA_BINS histogram bins.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from moe_monitor import core
from moe_monitor.core.loadmodel import balancedness, gpu_loads
from moe_monitor.core.membudget import MemoryBudget

from .layoutbook import LayoutBook

CLOSE_COST = 4  # a second's rollup costs about 3x its steps' int64 [L, E] in temporaries (stack, loads)
FUTURE_TOLERANCE_S = 5.0  # a step stamped further ahead of the wall clock counts as now
MAX_OPEN_SECONDS = 600  # open 1 s buckets at most (beyond: the oldest closes)
_PHASE_CODE = {name: code for code, name in enumerate(core.PHASES)}


@dataclass
class StepEntry:
    """One aggregated step held by an open second. counts_LE: int64 [L, E] (its ranks, late ones included)."""

    epoch: str
    step: int
    phase: str
    world: int
    counts_LE: np.ndarray
    tokens: int
    missing_ranks: int
    late_ranks: int = 0


@dataclass
class RollupCounters:
    """buckets_1s / buckets_60s: buckets emitted; dropped_steps / dropped_late_ranks: steps and late ranks
    that arrived after both their second and their minute closed (not in any rollup)."""

    buckets_1s: int = 0
    buckets_60s: int = 0
    dropped_steps: int = 0
    dropped_late_ranks: int = 0


@dataclass
class _Second:
    steps: dict[tuple[str, int], StepEntry] = field(default_factory=dict)
    last_added_s: float = -math.inf


@dataclass
class _Minute:
    record: core.RollupRecord | None = None
    last_added_s: float = -math.inf


def bucket_rollup(run: str, resolution_s: int, start_s: int, steps: Sequence[StepEntry],
                  book: LayoutBook) -> core.RollupRecord:
    """The RollupRecord of `steps` (one shape [L, E], at least one step): summed counts, tokens, steps per
    phase, and per step and layer the balancedness histogram and busiest / mean GPU loads under the layout in
    force at each step (GPU loads in tokens, even split over replicas)."""
    if not steps:
        raise ValueError("a bucket needs at least one step")
    counts_TLE = np.stack([s.counts_LE for s in steps])
    num_layers, num_experts = counts_TLE.shape[1:]
    hist_B = np.zeros(core.ETA_BINS, dtype=np.int64)
    max_sum = mean_sum = peak = 0.0
    gpus = 0
    by_epoch: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        by_epoch.setdefault(s.epoch, []).append(i)
    for epoch, members in by_epoch.items():
        index_T = np.asarray(members)
        step_T = np.fromiter((steps[i].step for i in members), dtype=np.int64, count=len(members))
        world = max(steps[i].world for i in members)
        for where, layout_LP, layout_gpus in book.layouts(epoch, step_T, num_layers, num_experts, world):
            loads_TLG = gpu_loads(counts_TLE[index_T[where]], layout_LP, layout_gpus)  # float64, slot form
            busiest_TL = loads_TLG.max(axis=-1)
            hist_B += core.eta_histogram(balancedness(loads_TLG))
            max_sum += float(busiest_TL.mean(axis=-1).sum())
            mean_sum += float(loads_TLG.mean(axis=-1).mean(axis=-1).sum())
            peak = max(peak, float(busiest_TL.max()))
            gpus = max(gpus, layout_gpus)
    phases = np.bincount([_PHASE_CODE[s.phase] for s in steps], minlength=len(core.PHASES)).astype(np.int64)
    return core.RollupRecord(
        run=run, resolution_s=int(resolution_s), start_s=int(start_s), steps=len(steps),
        tokens=sum(s.tokens for s in steps), steps_by_phase=phases,
        counts_LE=counts_TLE.sum(axis=0, dtype=np.int64), gpus=gpus, eta_hist_B=hist_B, max_load_sum=max_sum,
        mean_load_sum=mean_sum, max_load_peak=peak, missing_rank_steps=sum(s.missing_ranks for s in steps),
        late_rank_steps=sum(s.late_ranks for s in steps))


def late_only_rollup(run: str, start_s: int, rec: core.AggregateRecord) -> core.RollupRecord:
    """A 60 s partial holding only a late entry's ranks (no step: its step's second had closed)."""
    return core.RollupRecord(
        run=run, resolution_s=60, start_s=int(start_s), steps=0, tokens=rec.tokens,
        steps_by_phase=np.zeros(len(core.PHASES), dtype=np.int64), counts_LE=np.asarray(rec.counts_LE, np.int64),
        gpus=0, eta_hist_B=np.zeros(core.ETA_BINS, dtype=np.int64), max_load_sum=0.0, mean_load_sum=0.0,
        max_load_peak=0.0, late_rank_steps=int(rec.ranks_R.size))


class RollupBuilder:
    """Open 1 s and 60 s buckets of one run; add() aggregated records, close_due() the finished buckets."""

    def __init__(self, run: str, book: LayoutBook, grace_s: float = 3.0, budget: MemoryBudget | None = None,
                 max_open_bytes: int | None = None):
        """budget: the open seconds' steps reserve their bytes (CLOSE_COST times: closing one costs that) from it;
        max_open_bytes: at most this many (beyond either, the oldest open second closes early: early_seconds)."""
        self.run = core.check_run_name(run)
        self.budget, self.max_open_bytes = budget, max_open_bytes
        self._reservation = budget.try_reserve(0) if budget is not None else None
        self.open_bytes = 0  # int64 [L, E] of the open seconds' steps
        self.early_seconds = 0
        self._early: list[core.RollupRecord] = []  # closed early, emitted by the next close_due()
        self.book = book
        self.grace_s = float(grace_s)
        self.counters = RollupCounters()
        self.newest_time_s = -math.inf  # the newest aggregated step's time (bucketed)
        self._seconds: dict[int, _Second] = {}  # start -> open second, ascending
        self._minutes: dict[int, _Minute] = {}
        self._where: dict[tuple[str, int], int] = {}  # (epoch, step) -> start of its open second
        self._closed = {1: -math.inf, 60: -math.inf}  # the latest closed bucket start per resolution
        self._written = {1: -math.inf, 60: -math.inf}  # buckets at or before: written already, not emitted

    def already_written(self, resolution_s: int, start_s: float) -> None:
        """Buckets starting at or before start_s (at that resolution) were written by someone else."""
        self._written[resolution_s] = max(self._written[resolution_s], start_s)

    @property
    def open_seconds(self) -> int:
        return len(self._seconds)

    def add(self, rec: core.AggregateRecord, now_s: float, wall_s: float) -> None:
        """Fold one aggregated record (a step, or a late entry) into its buckets."""
        time_s = rec.time_s if rec.time_s <= wall_s + FUTURE_TOLERANCE_S else wall_s
        key = (rec.instance, rec.step)
        if rec.late:
            start = self._where.get(key)
            if start is not None:
                entry = self._seconds[start].steps[key]
                entry.counts_LE = entry.counts_LE + rec.counts_LE  # a new array: the record may still be encoded
                entry.tokens += rec.tokens
                entry.late_ranks += int(rec.ranks_R.size)
                self._seconds[start].last_added_s = now_s
            else:
                self._to_minute(late_only_rollup(self.run, _start(time_s, 60), rec), now_s,
                                dropped=(0, int(rec.ranks_R.size)))
            return
        self.newest_time_s = max(self.newest_time_s, time_s)
        entry = StepEntry(epoch=rec.instance, step=rec.step, phase=rec.phase, world=rec.world_size,
                          counts_LE=np.asarray(rec.counts_LE, dtype=np.int64), tokens=rec.tokens,
                          missing_ranks=int(rec.world_size - rec.ranks_R.size))
        start = _start(time_s, 1)
        second = self._seconds.get(start)
        if second is None and start <= self._closed[1]:  # its second closed: straight into its minute
            self._to_minute(bucket_rollup(self.run, 60, _start(time_s, 60), [entry], self.book), now_s,
                            dropped=(1, 0))
            return
        if second is None:
            second = self._seconds[start] = _Second()
            if len(self._seconds) > 1 and start < max(self._seconds):
                self._seconds = dict(sorted(self._seconds.items()))
        if key in second.steps:  # the same step twice (cannot happen from the assembler): keep the sum
            second.steps[key].counts_LE = second.steps[key].counts_LE + entry.counts_LE
        else:
            second.steps[key] = entry
            self._where[key] = start
            self.open_bytes += entry.counts_LE.nbytes
        second.last_added_s = now_s
        while self._seconds and not self._fits():  # over the budget: the oldest open second closes now
            self._close_second(*next(iter(self._seconds.items())), self._early)
            self.early_seconds += 1

    def _fits(self) -> bool:
        """Whether the open seconds' steps, with what closing one costs (CLOSE_COST times them), fit."""
        held = self.open_bytes * CLOSE_COST
        if self.max_open_bytes is not None and held > self.max_open_bytes:
            return False
        return self._reservation is None or self._reservation.resize_to(held)

    def release(self) -> None:
        """Give the open seconds' bytes back to the budget now (this builder is being dropped)."""
        if self._reservation is not None:
            self._reservation.release()
            self._reservation, self.max_open_bytes = None, 0

    def _close_second(self, start: int, second: _Second, out: list[core.RollupRecord]) -> None:
        """Close one open second: its rollup (to write unless someone did) and its part of its minute."""
        del self._seconds[start]
        self._closed[1] = max(self._closed[1], start)
        for key, entry in second.steps.items():
            self._where.pop(key, None)
            self.open_bytes -= entry.counts_LE.nbytes
        if self._reservation is not None:
            self._reservation.resize_to(max(0, self.open_bytes) * CLOSE_COST)
        record = self._second_rollup(start, list(second.steps.values()))
        if record is None:
            return
        if start > self._written[1]:
            out.append(record)
            self.counters.buckets_1s += 1
        self._to_minute(_as_minute(record), second.last_added_s, dropped=(record.steps, record.late_rank_steps))

    def close_due(self, now_s: float, wall_s: float, held_from_s: float = math.inf) -> list[core.RollupRecord]:
        """The buckets that closed, seconds first, each resolution in ascending start order. held_from_s: the
        earliest time of a step still assembling (it will land in the bucket of its time): no bucket that could
        hold it closes."""
        out, self._early = self._early, []
        while self._seconds:
            start, second = next(iter(self._seconds.items()))
            if not (self._due(start, 1, second.last_added_s, now_s, wall_s) and held_from_s >= start + 1
                    or len(self._seconds) > MAX_OPEN_SECONDS):
                break
            self._close_second(start, second, out)
        first_open_second = next(iter(self._seconds), math.inf)
        for start in sorted(self._minutes):
            minute = self._minutes[start]
            if first_open_second < start + 60 or held_from_s < start + 60 \
                    or not self._due(start, 60, minute.last_added_s, now_s, wall_s):
                break
            del self._minutes[start]
            self._closed[60] = max(self._closed[60], start)
            if minute.record is not None and start > self._written[60]:
                out.append(minute.record)
                self.counters.buckets_60s += 1
        return out

    def _due(self, start: int, resolution_s: int, last_added_s: float, now_s: float, wall_s: float) -> bool:
        end = start + resolution_s + self.grace_s
        return self.newest_time_s >= end or (wall_s >= end and now_s - last_added_s >= self.grace_s)

    def _second_rollup(self, start: int, steps: list[StepEntry]) -> core.RollupRecord | None:
        """The second's rollup over its steps of the most common shape (the others are dropped, counted)."""
        shapes = [s.counts_LE.shape for s in steps]
        shape = max(set(shapes), key=shapes.count)
        kept = [s for s in steps if s.counts_LE.shape == shape]
        self.counters.dropped_steps += len(steps) - len(kept)
        return bucket_rollup(self.run, 1, start, kept, self.book) if kept else None

    def _to_minute(self, record: core.RollupRecord, now_s: float, dropped: tuple[int, int]) -> None:
        """Merge a partial (resolution 60, its minute's start) into its open minute, whose data last arrived at
        now_s (monotonic); dropped = (steps, late ranks) it holds, counted as dropped when the minute closed."""
        start = record.start_s
        minute = self._minutes.get(start)
        if minute is None:
            if start <= self._closed[60]:
                self.counters.dropped_steps += dropped[0]
                self.counters.dropped_late_ranks += dropped[1]
                return
            minute = self._minutes[start] = _Minute()
        previous = minute.record
        if previous is not None and previous.counts_LE.shape != record.counts_LE.shape:
            self.counters.dropped_steps += previous.steps  # a new model under the run name: the newer shape wins
            previous = None
        minute.record = record if previous is None else core.merge_rollups([previous, record], 60, start)
        minute.last_added_s = max(minute.last_added_s, now_s)


def _start(time_s: float, resolution_s: int) -> int:
    """Start (unix s) of the bucket holding time_s."""
    return int(math.floor(time_s / resolution_s)) * resolution_s


def _as_minute(record: core.RollupRecord) -> core.RollupRecord:
    """A 1 s rollup as a partial of its minute."""
    return core.merge_rollups([record], 60, _start(record.start_s, 60))

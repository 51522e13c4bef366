"""A run being watched: one Source, the step window it fills, NVML history and reader-side counters.

No Streamlit here: the app keeps a WatchedRun in st.session_state, the benchmark and tests use it directly.

Collector restarts: every record names its collector process (wire.StepRecord.instance, one per rank).
When a rank's records come from a new instance, the collector restarted under the same run name (its step
ids start again at 0): the window and the sample ring start afresh, `restarted_at_s` says when, and records
of the old instances that still arrive are skipped (counted in `skipped_old_records`, not as bad records).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import wire
from dashboard.live.gpu_history import GpuHistory
from dashboard.live.samples import SampleRing
from dashboard.live.window import StepWindow
from dashboard.sources.base import Source

RESTART_NOTE_S = 120.0  # how long "collector restarted at ..." stays on the page (wall seconds)


@dataclass
class TickStats:
    """What one tick did: entries taken, bad records skipped, wall time of poll + ingest in ms."""

    steps_in: int
    gpu_in: int
    bad: int
    more: bool
    ms: float


class WatchedRun:
    """Polls a Source and keeps the last `window_steps` steps (ranks summed) and NVML samples.

    The window is created at the first step record (its [L, E] comes from the metadata when present, else
    from that record). bad_records counts entries that did not decode plus records the window refused
    (wrong shape, duplicates, too old); last_error says why the latest one was skipped. missed_steps counts
    steps that never reached the dashboard (step ids that jump within one collector instance, beyond the
    collector's own dropped count), gap_note says why."""

    def __init__(self, source: Source, window_steps: int, max_entries_per_tick: int = 2000):
        if window_steps < 1:
            raise ValueError(f"window_steps must be at least 1, got {window_steps}")
        self.source = source
        self.window_steps = window_steps
        self.max_entries_per_tick = max_entries_per_tick
        self.window: StepWindow | None = None
        self.gpus = GpuHistory()
        self.samples = SampleRing(window_steps)  # sampled routing rows for the What-if traffic model
        self.bad_records = 0
        self.last_error = ""
        self.steps_read = 0
        self.world_size = 1
        self.last_tick: TickStats | None = None
        self.instance_of_rank: dict[int, str] = {}
        self._old_instances: set[str] = set()
        self._instance_started_s = float("-inf")
        self.restarts = 0
        self.restarted_at_s: float | None = None  # collector time of the new instance's first record
        self._restart_seen_s = float("-inf")  # reader wall time the restart was noticed
        self.skipped_old_records = 0
        self._last_step_of: dict[tuple[str, int], tuple[int, int]] = {}  # (instance, rank) -> (step, dropped)
        self.missed_steps = 0
        self.gap_note = ""

    def tick(self) -> TickStats:
        """One non-blocking poll, folded into the window."""
        started = time.perf_counter()
        batch = self.source.poll(self.max_entries_per_tick)
        self.bad_records += batch.bad_records
        if batch.last_error:
            self.last_error = batch.last_error
        refused = taken = 0
        for rec in batch.steps:
            if not self._current_instance(rec):
                self.skipped_old_records += 1
                continue
            try:
                self._window_for(rec).add(rec)
                self.samples.add(rec)
                self.world_size = max(self.world_size, rec.world_size)
                taken += 1
            except ValueError as exc:
                refused += 1
                self.last_error = f"step {rec.step} rank {rec.rank}: {exc}"
                continue
            self._check_gap(rec, getattr(batch, "trimmed", False))
        self.bad_records += refused
        self.steps_read += taken
        for sample in batch.gpu_samples:
            self.gpus.add(sample)
        self.last_tick = TickStats(steps_in=len(batch.steps), gpu_in=len(batch.gpu_samples),
                                   bad=batch.bad_records + refused, more=batch.more,
                                   ms=(time.perf_counter() - started) * 1e3)
        return self.last_tick

    def _current_instance(self, rec: wire.StepRecord) -> bool:
        """True when rec belongs to the collector instances being shown; a rank's new instance (newer than
        the current ones) restarts the window. False for records of instances already replaced."""
        known = self.instance_of_rank.get(rec.rank)
        if known == rec.instance:
            return True
        if rec.instance in self._old_instances:
            return False
        if known is None:  # first record of this rank (or of this rank since the restart)
            self.instance_of_rank[rec.rank] = rec.instance
            first = self._instance_started_s == float("-inf")
            self._instance_started_s = rec.time_s if first else min(self._instance_started_s, rec.time_s)
            return True
        if rec.time_s < self._instance_started_s:  # an even older collector: not the one to show
            self._old_instances.add(rec.instance)
            return False
        self._restart(rec)
        return True

    def _restart(self, rec: wire.StepRecord) -> None:
        """rec's rank restarted: retire that rank's previous instance only (the other ranks' collectors go
        on), and start a fresh window."""
        self._old_instances.add(self.instance_of_rank[rec.rank])
        self.instance_of_rank[rec.rank] = rec.instance
        self._instance_started_s = rec.time_s
        self.window = None
        self.samples = SampleRing(self.window_steps)
        self.world_size = 1
        self._last_step_of = {}
        self.restarts += 1
        self.restarted_at_s = rec.time_s
        self._restart_seen_s = time.time()

    @property
    def restart_note(self) -> str:
        """'collector restarted at <time>' for RESTART_NOTE_S after a restart was noticed, else ''."""
        if self.restarted_at_s is None or time.time() - self._restart_seen_s > RESTART_NOTE_S:
            return ""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.restarted_at_s))
        return f"collector restarted at {stamp} (window started afresh)"

    def _check_gap(self, rec: wire.StepRecord, trimmed: bool) -> None:
        key = (rec.instance, rec.rank)
        last = self._last_step_of.get(key)
        self._last_step_of[key] = (rec.step, rec.dropped_steps)
        if last is None or rec.step <= last[0]:
            return
        missed = rec.step - last[0] - 1 - max(0, rec.dropped_steps - last[1])
        if missed > 0:
            self.missed_steps += missed
            why = "stream trimmed before the dashboard read them" if trimmed else "absent from the stream"
            self.gap_note = f"missed {self.missed_steps} steps ({why})"

    def _window_for(self, rec: wire.StepRecord) -> StepWindow:
        if self.window is None:
            meta = self.source.meta()
            num_layers, num_experts = rec.counts_LE.shape
            stale_meta = meta is not None and meta.instance and rec.instance and meta.instance != rec.instance
            if meta is not None and not stale_meta and \
                    (len(meta.layer_names), meta.num_experts) != (num_layers, num_experts):
                raise ValueError(f"counts are [{num_layers}, {num_experts}] but the run metadata says "
                                 f"[{len(meta.layer_names)}, {meta.num_experts}]")
            self.window = StepWindow(self.window_steps, num_layers, num_experts)
        return self.window

    @property
    def dropped_steps(self) -> int:
        """Steps the collectors dropped (cumulative, summed over ranks) as of their latest records."""
        return sum(self.window.dropped_by_rank.values()) if self.window else 0

"""A run being watched: one Source, the step window it fills, NVML history and reader-side counters.

No Streamlit here: the app keeps a Monitor in st.session_state, the benchmark and tests use it directly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import wire
from dashboard.gpu_history import GpuHistory
from dashboard.source import Source
from dashboard.whatif_samples import SampleRing
from dashboard.window import StepWindow


@dataclass
class TickStats:
    """What one tick did: entries taken, bad records skipped, wall time of poll + ingest in ms."""

    steps_in: int
    gpu_in: int
    bad: int
    more: bool
    ms: float


class Monitor:
    """Polls a Source and keeps the last `window_steps` steps (ranks summed) and NVML samples.

    The window is created at the first step record (its [L, E] comes from the metadata when present, else
    from that record). bad_records counts entries that did not decode plus records the window refused
    (wrong shape, duplicates, too old); last_error says why the latest one was skipped."""

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

    def tick(self) -> TickStats:
        """One non-blocking poll, folded into the window."""
        started = time.perf_counter()
        batch = self.source.poll(self.max_entries_per_tick)
        self.bad_records += batch.bad_records
        if batch.last_error:
            self.last_error = batch.last_error
        refused = 0
        for rec in batch.steps:
            try:
                self._window_for(rec).add(rec)
                self.samples.add(rec)
                self.world_size = max(self.world_size, rec.world_size)
            except ValueError as exc:
                refused += 1
                self.last_error = f"step {rec.step} rank {rec.rank}: {exc}"
        self.bad_records += refused
        self.steps_read += len(batch.steps) - refused
        for sample in batch.gpu_samples:
            self.gpus.add(sample)
        self.last_tick = TickStats(steps_in=len(batch.steps), gpu_in=len(batch.gpu_samples),
                                   bad=batch.bad_records + refused, more=batch.more,
                                   ms=(time.perf_counter() - started) * 1e3)
        return self.last_tick

    def _window_for(self, rec: wire.StepRecord) -> StepWindow:
        if self.window is None:
            meta = self.source.meta()
            num_layers, num_experts = rec.counts_LE.shape
            if meta is not None and (len(meta.layer_names), meta.num_experts) != (num_layers, num_experts):
                raise ValueError(f"counts are [{num_layers}, {num_experts}] but the run metadata says "
                                 f"[{len(meta.layer_names)}, {meta.num_experts}]")
            self.window = StepWindow(self.window_steps, num_layers, num_experts)
        return self.window

    @property
    def dropped_steps(self) -> int:
        """Steps the collectors dropped (cumulative, summed over ranks) as of their latest records."""
        return sum(self.window.dropped_by_rank.values()) if self.window else 0

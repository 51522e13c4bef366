"""Cursor: a trace read forward in chunks of whole steps, as if live (the dashboard's replay source and the
replay CLI). Each chunk holds the layout records that take force up to its last step (all of those before
the first step with the first chunk), the NVML samples up to its last step's time and the layer timings of
its steps (core.TimingRecord, every rank; with those of any step id between the previous chunk's last step
and this one's that has timings but no step record).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moe_monitor import core
from moe_monitor.core.tracefile.reader import TraceReader


@dataclass
class Chunk:
    steps: list[core.StepRecord] = field(default_factory=list)
    layouts: list[core.LayoutRecord] = field(default_factory=list)
    gpu_samples: list[core.GpuSample] = field(default_factory=list)
    timings: list[core.TimingRecord] = field(default_factory=list)
    more: bool = False


class Cursor:
    """Forward reader of a TraceReader's steps; refresh(reader) continues on a reopened (grown) file."""

    def __init__(self, reader: TraceReader):
        self._next_step = -1  # the lowest step id not handed out yet (-1: none handed out)
        self._layouts_sent = 0
        self._time_s = -np.inf  # samples up to this time were handed out
        self.refresh(reader)

    def refresh(self, reader: TraceReader) -> None:
        self.reader = reader
        self.timeline = reader.timeline()
        self._samples = reader.gpu_samples()
        self._index = int(np.searchsorted(self.timeline.step_T, self._next_step, side="left"))

    @property
    def done(self) -> bool:
        return self._index >= self.timeline.num_steps

    def next_chunk(self, max_entries: int) -> Chunk:
        """The next whole steps, about max_entries records (at least one step)."""
        chunk = Chunk()
        tl = self.timeline
        if not self.done:
            ranks = max(1, self.reader.meta.world_size)
            count = max(1, int(max_entries) // ranks)
            last_index = min(tl.num_steps, self._index + count) - 1
            first, last = int(tl.step_T[self._index]), int(tl.step_T[last_index])
            chunk.steps = self.reader.read_steps(first, last)
            chunk.timings = self.reader.read_timings(max(self._next_step, 0), last)
            self._index = last_index + 1
            self._next_step = last + 1
            chunk.more = not self.done
            upto_step, upto_time = last, float(tl.time_s_T[last_index])
        else:
            upto_step, upto_time = np.iinfo(np.int64).max, np.inf
        layouts = self.reader.layouts
        take = [rec for rec in layouts[self._layouts_sent:] if rec.step <= upto_step]
        chunk.layouts, self._layouts_sent = take, self._layouts_sent + len(take)
        chunk.gpu_samples = [s for s in self._samples if self._time_s < s.time_s <= upto_time]
        self._time_s = max(self._time_s, upto_time)
        return chunk

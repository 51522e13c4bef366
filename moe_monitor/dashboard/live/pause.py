"""Pausing a live run, pure (no Streamlit): the pages keep showing the window as it was when paused while the
live WatchedRun goes on polling (so nothing is lost: the stream is read as usual and the live window keeps its
newest steps); resume shows the live window again, with every step that arrived meanwhile.

freeze() copies what the pages read of a WatchedRun (the step window with its cached GPU loads, the layout
history, the sampled rows, the NVML history, the counters); the source stays shared, so health stays live.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from moe_monitor.dashboard.live.watched import WatchedRun


def freeze(watched: WatchedRun) -> WatchedRun:
    """A copy of `watched` that later ticks of `watched` do not change (its source is the same object: never
    tick the copy)."""
    frozen = copy.copy(watched)
    frozen.window = copy.deepcopy(watched.window)
    frozen.layouts = copy.deepcopy(watched.layouts)
    frozen.samples = copy.deepcopy(watched.samples)
    frozen.gpus = copy.deepcopy(watched.gpus)
    frozen.timings = copy.deepcopy(watched.timings)
    frozen.assembler = copy.deepcopy(watched.assembler)
    frozen.retired = copy.deepcopy(watched.retired)
    return frozen


@dataclass
class Paused:
    """A paused live run: frozen (what the pages show), at_step: its newest step (None before the first),
    steps_read: the live run's step records read when paused."""

    frozen: WatchedRun
    at_step: int | None
    steps_read: int

    @classmethod
    def of(cls, watched: WatchedRun) -> Paused:
        window = watched.window
        return cls(freeze(watched), None if window is None else window.newest_step, watched.steps_read)

    def waiting(self, live: WatchedRun) -> tuple[int, bool]:
        """(new steps in the live window since the pause, whether there may be more than that: the live window
        is full of them, or the collector restarted and its step ids started again)."""
        window = live.window
        if window is None or window.size == 0:
            return 0, False
        steps = window.step_C[window.ordered_slots()]
        if live.restarts != self.frozen.restarts or self.at_step is None:
            return int(steps.size), live.restarts != self.frozen.restarts
        new = int(np.count_nonzero(steps > self.at_step))
        return new, new >= window.capacity

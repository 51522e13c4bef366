"""The window of a seekable source (dashboard.sources.base.Seekable: a trace file) over a chosen range of its
timeline, pure (no Streamlit): the pages analyse a WatchedRun filled from seek(first, last) as a live run's.

RangeReplay.show(first, last) takes timeline indices (inclusive). A range of the same width moved forward seeks
only the new steps into the same window (its ring lets the oldest go); any other move seeks the whole range into
a fresh window. The seek's layout records go to the window's layout history, so each step's GPU loads use the
layout in force at that step.

Shape legend (README, Conventions): T steps of the timeline.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.base import Batch, Health


class _Feed:
    """A Source that hands a WatchedRun the batches of seek() calls (all at once), with the seekable source's
    metadata and health. recorded: every rank of a step comes in the same poll."""

    recorded = True

    def __init__(self, parent):
        self.parent = parent
        self._waiting: list[Batch] = []
        self.note = ""
        self.last_seen_s: float | None = None

    def put(self, batch: Batch) -> None:
        self._waiting.append(batch)

    def poll(self, max_entries: int) -> Batch:
        if not self._waiting:
            return Batch()
        out = Batch()
        for batch in self._waiting:
            out.steps += batch.steps
            out.gpu_samples += batch.gpu_samples
            out.layouts += batch.layouts
            out.aggregates += batch.aggregates
            out.timings += batch.timings
            out.bad_records += batch.bad_records
            out.last_error = batch.last_error or out.last_error
        self._waiting = []
        return out

    def meta(self) -> core.RunMeta | None:
        return self.parent.meta()

    def health(self) -> Health:
        """The seekable source's health, its note saying which range is shown, last seen the newest step's
        time in the range (as a replay read up to there would say)."""
        health = self.parent.health()
        return dataclasses.replace(health, note=self.note or health.note,
                                   last_seen_s=self.last_seen_s if self.last_seen_s is not None else health.last_seen_s)


class RangeReplay:
    """A seekable source (timeline() and seek()), its timeline read once, and the WatchedRun of the range
    shown. seeks: seek() calls made (the tests count them); last_seek: (first_step, last_step) of the latest."""

    def __init__(self, source, max_steps: int):
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.source = source
        self.max_steps = int(max_steps)
        self.timeline = source.timeline()
        self.step_T = np.asarray(self.timeline.step_T, dtype=np.int64)
        self._range: tuple[int, int] | None = None
        self._watched: WatchedRun | None = None
        self._feed: _Feed | None = None
        self.seeks = 0
        self.last_seek: tuple[int, int] | None = None

    @property
    def size(self) -> int:
        """Steps in the recording (timeline entries)."""
        return int(self.step_T.size)

    def show(self, first: int, last: int) -> WatchedRun:
        """The WatchedRun holding exactly the timeline entries first..last (indices, inclusive; at most
        max_steps of them: the newest are kept)."""
        if self.size == 0:
            raise ValueError("the recording has no steps")
        first, last = max(0, int(first)), min(self.size - 1, int(last))
        if last < first:
            raise ValueError(f"empty range {first}..{last}")
        first = max(first, last - self.max_steps + 1)
        held = self._range
        if held == (first, last) and self._watched is not None:
            return self._watched
        width = last - first + 1
        if (held is not None and self._watched is not None and self._feed is not None
                and held[1] - held[0] + 1 == width and held[0] < first <= held[1] + 1):
            self._seek(int(self.step_T[held[1] + 1]), int(self.step_T[last]))  # only the new steps
        else:
            self._feed = _Feed(self.source)
            self._watched = WatchedRun(self._feed, width, max_entries_per_tick=1 << 30)
            self._seek(int(self.step_T[first]), int(self.step_T[last]))
        if self._watched is None or self._feed is None:
            raise ValueError("no window to show")  # unreachable: both are set above
        self._watched.tick()
        self._range = (first, last)
        end = "the end of the recording (replay finished)" if last == self.size - 1 else f"step {int(self.step_T[-1])}"
        self._feed.note = (f"recording: showing steps {int(self.step_T[first])}–{int(self.step_T[last])} of "
                           f"{int(self.step_T[0])} to {end}")
        self._feed.last_seen_s = float(np.asarray(self.timeline.time_s_T)[last])
        return self._watched

    def _seek(self, first_step: int, last_step: int) -> None:
        if self._feed is None:
            raise ValueError("no window to seek into")  # unreachable: show() sets it first
        self.seeks += 1
        self.last_seek = (first_step, last_step)
        try:
            batch = self.source.seek(first_step, last_step)
        except Exception as exc:  # a source must not take the page down: one bad record, an empty range
            batch = Batch(bad_records=1, last_error=f"seek {first_step}..{last_step} failed: "
                                                    f"{type(exc).__name__}: {exc}"[:500])
        self._feed.put(batch)

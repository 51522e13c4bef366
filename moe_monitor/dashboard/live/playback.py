"""Replay like a video, pure (no Streamlit): which range of a recording's timeline the pages analyse, and how
play, step, seek and the jumps move it.

A Playback is a range of timeline entries first..last (indices, inclusive; one entry per step, oldest first)
and whether it is playing. Every move keeps the range's width (except a seek) and clamps it to the recording.
Playing advances the end through the recording's time at speed x (advance()), or a tenth of the width per
render at MAX_SPEED; reaching the end stops, play at the end starts again. The rules: docs/dashboard.md,
"Replay like a video, pause a live run".

Shape legend (README, Conventions): T steps of the timeline (the whole recording).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

SPEEDS = ("1x", "10x", "max")
MAX_SPEED = "max"
SPEED_FACTOR = {"1x": 1.0, "10x": 10.0}


class TimelineLike(Protocol):
    """What these functions read of a traces.Timeline: step_T int64 [T], time_s_T float64 [T], phase_T str [T],
    balancedness_T float64 [T] (NaN unknown), rebalance_steps (steps each layout change is in force from)."""

    step_T: np.ndarray
    time_s_T: np.ndarray
    phase_T: np.ndarray
    balancedness_T: np.ndarray
    rebalance_steps: object


@dataclass(frozen=True)
class Playback:
    """The range shown (timeline indices first..last inclusive), playing or not, and the speed."""

    first: int
    last: int
    playing: bool = False
    speed: str = "1x"

    @property
    def width(self) -> int:
        return self.last - self.first + 1


def _size(timeline: TimelineLike) -> int:
    return int(np.asarray(timeline.step_T).size)


def clamp(first: int, width: int, size: int) -> tuple[int, int]:
    """(first, last) of a range of `width` entries (at least 1, at most size) starting near `first`, inside
    0..size-1. ValueError for an empty timeline."""
    if size < 1:
        raise ValueError("the recording has no steps")
    width = min(max(1, int(width)), size)
    first = min(max(0, int(first)), size - width)
    return first, first + width - 1


def initial(timeline: TimelineLike, width: int) -> Playback:
    """The newest `width` steps of the recording (what a replay read to its end showed), paused."""
    size = _size(timeline)
    first, last = clamp(size - width, width, size)
    return Playback(first, last)


def shift(pb: Playback, by: int, timeline: TimelineLike) -> Playback:
    """The range moved by `by` steps (negative: back), same width, clamped to the recording. A range that covers
    the whole recording cannot move: its far end moves instead (forward drops its oldest steps, back its newest),
    so a step button always does something."""
    size = _size(timeline)
    if pb.width >= size > 1 and by:
        step = min(abs(int(by)), size - 1)
        return replace(pb, first=step, last=size - 1) if by > 0 else replace(pb, first=0, last=size - 1 - step)
    first, last = clamp(pb.first + by, pb.width, size)
    return replace(pb, first=first, last=last)


def seek_steps(pb: Playback, timeline: TimelineLike, first_step: int, last_step: int,
               max_width: int | None = None) -> Playback:
    """The range of the entries whose step ids lie in first_step..last_step (at least one entry: the nearest),
    at most max_width entries (the newest of them are kept)."""
    step_T = np.asarray(timeline.step_T)
    lo, hi = sorted((int(first_step), int(last_step)))
    first = int(np.searchsorted(step_T, lo, side="left"))
    last = int(np.searchsorted(step_T, hi, side="right")) - 1
    size = step_T.size
    first, last = min(first, size - 1), max(last, 0)
    if last < first:
        first = last = min(first, size - 1)
    if max_width is not None and last - first + 1 > max_width:
        first = last - max_width + 1
    return replace(pb, first=first, last=last)


def centre_on(pb: Playback, index: int, timeline: TimelineLike) -> Playback:
    """The range of the same width with entry `index` in its middle (clamped to the recording)."""
    first, last = clamp(int(index) - pb.width // 2, pb.width, _size(timeline))
    return replace(pb, first=first, last=last)


def phase_mask(timeline: TimelineLike, phase: str) -> np.ndarray:
    """bool [T]: entries of the phase filter ('both' keeps every step; 'prefill' / 'decode' / 'train' their own)."""
    phase_T = np.asarray(timeline.phase_T, dtype=object)
    if phase == "both":
        return np.ones(phase_T.size, dtype=bool)
    return phase_T == phase


def worst_index(timeline: TimelineLike, phase: str = "both") -> int | None:
    """Index of the step with the lowest per-step balancedness among the phase filter's steps (the earliest
    on a tie); None when none of them has a known balancedness."""
    eta_T = np.asarray(timeline.balancedness_T, dtype=np.float64)
    ok = phase_mask(timeline, phase) & np.isfinite(eta_T)
    if not ok.any():
        return None
    return int(np.flatnonzero(ok)[np.argmin(eta_T[ok])])


def next_rebalance_index(timeline: TimelineLike, after_step: int) -> int | None:
    """Index of the first step at or after the next layout change strictly after step `after_step` (the step
    the change is in force from); None when no change comes later in the recording."""
    step_T = np.asarray(timeline.step_T)
    later = sorted(int(s) for s in np.asarray(timeline.rebalance_steps, dtype=np.int64).ravel() if s > after_step)
    for step in later:
        at = int(np.searchsorted(step_T, step, side="left"))
        if at < step_T.size:
            return at
    return None


def centre_step(pb: Playback, timeline: TimelineLike) -> int:
    """The step id in the middle of the range (the entry centre_on puts there)."""
    return int(np.asarray(timeline.step_T)[pb.first + pb.width // 2])


def play(pb: Playback, timeline: TimelineLike) -> Playback:
    """Start playing (from the beginning when the range already ends at the recording's end; a range that
    covers the whole recording plays as its first half, which has room to move)."""
    size = _size(timeline)
    if pb.last >= size - 1:
        width = (size + 1) // 2 if pb.width >= size > 1 else pb.width
        first, last = clamp(0, width, size)
        pb = replace(pb, first=first, last=last)
    return replace(pb, playing=True)


def advance(pb: Playback, timeline: TimelineLike, elapsed_s: float) -> Playback:
    """The range after `elapsed_s` wall seconds of play: at speed x its end moves to the last step whose time is
    within elapsed_s x speed of the current end's time, at MAX_SPEED a tenth of the width (at least one step
    either way, so a pause in the recording does not stall the replay); stops at the recording's end.
    Unchanged when not playing."""
    if not pb.playing:
        return pb
    size = _size(timeline)
    if pb.speed == MAX_SPEED:
        by = max(1, pb.width // 10)
    else:
        factor = SPEED_FACTOR.get(pb.speed, 1.0)
        time_T = np.asarray(timeline.time_s_T, dtype=np.float64)
        now = time_T[pb.last]
        target = now + max(0.0, float(elapsed_s)) * factor if math.isfinite(now) else now
        end = int(np.searchsorted(time_T, target, side="right")) - 1 if math.isfinite(target) else pb.last
        by = max(1, end - pb.last)
    moved = shift(pb, by, timeline)
    return replace(moved, playing=moved.last < size - 1)


def range_label(pb: Playback, timeline: TimelineLike) -> str:
    """'steps A–B (N steps) of X–Y' for the page."""
    step_T = np.asarray(timeline.step_T)
    return (f"steps {int(step_T[pb.first])}–{int(step_T[pb.last])} ({pb.width} steps) of the recording's "
            f"{int(step_T[0])}–{int(step_T[-1])}")

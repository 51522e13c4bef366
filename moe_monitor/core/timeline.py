"""The layout timeline: which layout is in force at step s. A layout change at step s is in force from s until
the next change; before the first change the run's own layout (its metadata's) is. Every reader that turns counts
into GPU loads (the aggregator's rollups, trace balancedness, the dashboard's window and pages, the planner's
simulator) asks this module, so a change means the same step everywhere. Pure: no I/O.

Shape legend: C layout changes (ascending by step), T steps.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")
MAX_CHANGES = 1024  # layout changes a timeline keeps (the collectors' layout stream keeps ~1000)


def index_in_force(change_steps_C: Sequence[int] | np.ndarray, step_T: Sequence[int] | np.ndarray) -> np.ndarray:
    """int64 [T]: for each step, the index into change_steps_C (ascending) of the change in force, the last one at
    or before the step; -1 before the first change (the run's own layout)."""
    starts_C = np.asarray(change_steps_C, dtype=np.int64)
    return np.searchsorted(starts_C, np.asarray(step_T, dtype=np.int64), side="right") - 1


class LayoutTimeline(Generic[T]):
    """Layout changes (any payload T: a map, a checked LayoutChange...) ascending by step, at most max_changes (the
    oldest forgotten first, counted in `forgotten`). A change for a step that already has one replaces it (every
    rank publishes the same rebalance; a collector that re-sends its layout sends the same change again)."""

    def __init__(self, max_changes: int = MAX_CHANGES):
        if max_changes < 1:
            raise ValueError(f"max_changes must be at least 1, got {max_changes}")
        self.max_changes = max_changes
        self.steps: list[int] = []
        self.items: list[T] = []
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def add(self, step: int, item: T) -> None:
        at = bisect.bisect_left(self.steps, step)
        if at < len(self.steps) and self.steps[at] == step:
            self.items[at] = item
            return
        self.steps.insert(at, step)
        self.items.insert(at, item)
        while len(self.steps) > self.max_changes:
            del self.steps[0], self.items[0]
            self.forgotten += 1

    def remove_if(self, drop: Callable[[T], bool]) -> None:
        """Forget the changes for which drop(item) is true."""
        kept = [(step, item) for step, item in zip(self.steps, self.items) if not drop(item)]
        self.steps, self.items = [s for s, _ in kept], [i for _, i in kept]

    def index_at(self, step_T: Sequence[int] | np.ndarray) -> np.ndarray:
        """int64 [T]: index into items of the change in force at each step; -1 before the first (index_in_force)."""
        return index_in_force(self.steps, step_T)

    def in_force(self, step: int) -> T | None:
        """The change in force at `step`; None before the first (the run's own layout is)."""
        at = bisect.bisect_right(self.steps, step)
        return self.items[at - 1] if at else None

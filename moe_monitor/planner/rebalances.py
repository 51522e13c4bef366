"""Rebalance health: from the layout changes a run published (an engine's EPLB, layouts applied by hand), how
often the layout changes, how long since the last change, what the changes moved, and whether rebalancing has
stopped (an engine's async EPLB can stop silently while its health check still answers).

Input: changes ascending by time, each (time_s, layout_LP [L, P], gpus, source) with source "engine" or
"apply" (the run's initial layout is not a change). Pure numpy.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .repair import experts_copied

STOPPED_AFTER_INTERVALS = 3.0  # rebalancing has stopped when the last change is this many usual gaps old
HOUR_S = 3600.0


@dataclass(frozen=True)
class RebalanceHealth:
    """changes: layout changes seen; last_age_s: seconds since the newest (None: none yet); per_hour: changes
    in the last hour; interval_s: median gap between changes (None: fewer than two); moves: experts copied by
    the changes (planner.repair.experts_copied, from the layout before each); bytes_moved: moves x expert bytes
    (None when the expert's size is unknown); stopped: the last change is older than STOPPED_AFTER_INTERVALS
    usual gaps."""

    changes: int
    last_age_s: float | None
    per_hour: float
    interval_s: float | None
    moves: int
    bytes_moved: float | None
    stopped: bool

    def sentence(self) -> str:
        if not self.changes:
            return "no rebalance seen: the layout has not changed since the run started"
        text = (f"{self.changes} rebalance{'s' if self.changes > 1 else ''}, the last {self.last_age_s:,.0f} s ago, "
                f"{self.per_hour:g} in the last hour, {self.moves:,} experts copied")
        if self.bytes_moved is not None:
            text += f" ({self.bytes_moved / 1e9:,.1f} GB)"
        if self.stopped and self.interval_s is not None:
            text += f"; rebalancing looks stopped (usually every {self.interval_s:,.0f} s)"
        return text


def rebalance_health(changes: Sequence[tuple[float, np.ndarray, int, str]], now_s: float,
                     initial_LP: np.ndarray | None = None, expert_bytes: float | None = None,
                     copied: Callable[[np.ndarray, np.ndarray, int], int] = experts_copied) -> RebalanceHealth:
    """RebalanceHealth of `changes` (module docstring) at now_s; initial_LP: the layout before the first change
    (its moves are counted from it; None: the first change moves nothing); copied: experts_copied, or a reader's
    memo of it (a live page asks every tick, about 1 ms a change at DeepSeek-V3's shape)."""
    kept = sorted((c for c in changes if c[3] in ("engine", "apply")), key=lambda c: c[0])
    if not kept:
        return RebalanceHealth(0, None, 0.0, None, 0, 0.0 if expert_bytes else None, False)
    times_C = np.array([c[0] for c in kept], dtype=np.float64)
    moves = 0
    before = initial_LP
    for _, layout_LP, gpus, _ in kept:
        if before is not None and np.shape(before) == np.shape(layout_LP):
            moves += copied(before, layout_LP, gpus)
        before = layout_LP
    last_age_s = max(0.0, now_s - float(times_C[-1]))
    interval_s = float(np.median(np.diff(times_C))) if times_C.size > 1 else None
    stopped = interval_s is not None and interval_s > 0 and last_age_s > STOPPED_AFTER_INTERVALS * interval_s
    return RebalanceHealth(
        changes=len(kept), last_age_s=last_age_s, per_hour=float((times_C > now_s - HOUR_S).sum()),
        interval_s=interval_s, moves=moves, bytes_moved=None if expert_bytes is None else moves * expert_bytes,
        stopped=bool(stopped))

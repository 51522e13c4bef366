"""Filling a step window by hand in tests: a rank's record as the assembled step of that rank alone (the window
takes assembled steps only; ranks of one step add into its row as a late entry's would)."""
from __future__ import annotations

import numpy as np

from moe_monitor import core


def one_rank(rec: core.StepRecord, epoch: str = "test") -> core.AggregateRecord:
    """The assembled step of one rank's record (its counts, tokens and dropped count; the rank alone); a field
    that is no integer gives a non-integer array, which the window refuses with ValueError."""
    return core.AggregateRecord(
        run=rec.run, step=rec.step, time_s=rec.time_s, phase=rec.phase, world_size=rec.world_size,
        counts_LE=rec.counts_LE, ranks_R=_vector(rec.rank), tokens_R=_vector(rec.tokens),
        dropped_R=_vector(rec.dropped_steps), instance=epoch)


def _vector(value) -> np.ndarray:
    try:
        return np.array([value], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([value], dtype=object)


def add_rank(window, rec: core.StepRecord) -> None:
    """Sum one rank's record into its step's row of `window` (a StepWindow), as an assembled step of that rank."""
    window.add_aggregate(one_rank(rec))

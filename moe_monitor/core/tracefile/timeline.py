"""Timeline: one entry per step of a trace, for the time axis of a replay (what a seek bar needs), built
from the small per-row columns only (never the counts).

Shape legend: T distinct steps, R rows (step, rank), C layout changes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moe_monitor import core


@dataclass(frozen=True)
class Timeline:
    """A trace's steps in order.

    step_T: int64 [T] distinct step ids, ascending; time_s_T: float64 [T] unix seconds the step ended (latest
    rank); phase_T: object [T] of str (core.PHASES; the first rank's); tokens_T: int64 [T] tokens summed over
    ranks; balancedness_T: float64 [T] mean over layers of the step's mean/max GPU load under the layout in
    force (NaN where unknown); rebalance_steps: int64 [C] steps from which each layout record is in force,
    ascending (a record for a step before the first is in force from the start)."""

    step_T: np.ndarray
    time_s_T: np.ndarray
    phase_T: np.ndarray
    tokens_T: np.ndarray
    balancedness_T: np.ndarray
    rebalance_steps: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.step_T.shape[0])

    @property
    def span_s(self) -> float:
        """Seconds from the first step to the last (0 for fewer than two)."""
        return float(self.time_s_T[-1] - self.time_s_T[0]) if self.num_steps > 1 else 0.0


def empty_timeline(layouts: Sequence[core.LayoutRecord] = ()) -> Timeline:
    return timeline_of_rows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, object),
                            np.zeros(0, np.int64), np.zeros(0), layouts)


def good_rows(step_R, rank_R, world_R, time_s_R, phase_R, tokens_R) -> np.ndarray:
    """bool [R]: the rows whose timeline fields are within the bounds of core/keys.py (a row failing them is a
    bad record: read_steps skips and counts it)."""
    time_s_R = np.asarray(time_s_R, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ok = (step_R >= 0) & (step_R < core.MAX_STEP) & (rank_R >= 0) & (rank_R < world_R)
        ok &= (world_R <= core.MAX_WORLD) & np.isfinite(time_s_R) & (np.abs(time_s_R) < core.MAX_TIME_S)
        ok &= (tokens_R >= 0) & (tokens_R < core.MAX_TOKENS)
    ok &= np.isin(phase_R, core.PHASES)
    return ok


def timeline_of_rows(step_R: np.ndarray, rank_R: np.ndarray, time_s_R: np.ndarray, phase_R: np.ndarray,
                     tokens_R: np.ndarray, balancedness_R: np.ndarray,
                     layouts: Sequence[core.LayoutRecord] = ()) -> Timeline:
    """A Timeline from good rows (one per step and rank, in any order; a (step, rank) seen twice counts once)."""
    step_R = np.asarray(step_R, dtype=np.int64)
    rank_R = np.asarray(rank_R, dtype=np.int64)
    order = np.lexsort((rank_R, step_R))
    step_R, rank_R = step_R[order], rank_R[order]
    keep = np.ones(len(step_R), dtype=bool)
    keep[1:] = (np.diff(step_R) != 0) | (np.diff(rank_R) != 0)
    order = order[keep]
    step_R = step_R[keep]
    time_R = np.asarray(time_s_R, dtype=np.float64)[order]
    tokens_R = np.asarray(tokens_R, dtype=np.int64)[order]
    eta_R = np.asarray(balancedness_R, dtype=np.float64)[order]
    phase_R = np.asarray(phase_R, dtype=object)[order]
    if len(step_R):
        step_T, first_T = np.unique(step_R, return_index=True)
        time_T = np.maximum.reduceat(time_R, first_T)
        tokens_T = np.add.reduceat(tokens_R, first_T)
        eta_T = np.fmax.reduceat(eta_R, first_T)
        phase_T = phase_R[first_T]
    else:
        step_T, time_T, tokens_T = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
        eta_T, phase_T = np.zeros(0), np.zeros(0, dtype=object)
    return Timeline(step_T=step_T, time_s_T=time_T, phase_T=np.asarray(phase_T, dtype=object), tokens_T=tokens_T,
                    balancedness_T=eta_T, rebalance_steps=np.array(sorted(r.step for r in layouts), dtype=np.int64))

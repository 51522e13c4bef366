"""The re-plans of `moe-monitor diagnose` as layouts per scored window (planner.diagnose scores them). Each sees
only the window before the one it runs on and starts from the layout in force before it:

- ``replan_layouts``: a full plan (planner.api.plan) of each fit window;
- ``repair_layouts``: the advisor's repair within ``max_moves`` copies per change, every window (layers where a
  GPU holds two replicas of one expert cannot be repaired and are held as they are);
- ``advisor_layouts``: planner.advisor.advise with window = decision interval = ``every``.
Shape legend: T steps, L layers, E experts, P slots, G GPUs, W scored windows.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .advisor import DEFAULT_HORIZON, DEFAULT_MAX_MOVES, DEFAULT_SUB_WINDOWS, advise
from .api import plan
from .loads import duplicates_on_gpu
from .repair import repair_curve
from .simulate import CostModel
from .windows import split_windows

__all__ = ["DEFAULT_MAX_MOVES", "DEFAULT_HORIZON", "replan_layouts", "repaired_layout", "repair_layouts",
           "advisor_layouts"]

Bounds = list[tuple[int, int]]


def replan_layouts(counts_TLE: np.ndarray, current_LP: np.ndarray, bounds: Bounds, every: int,
                   next_layout: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """The layout [L, P] in force on each scored window [a, b) of ``bounds`` (W of them): next_layout(fit_TLE
    [every, L, E], layout before [L, P]) applied to each fit window with tokens; a fit window without tokens
    keeps the layout before."""
    prev, out = current_LP, []
    for a, _ in bounds:
        fit_TLE = counts_TLE[a - every:a]
        if fit_TLE.any():
            prev = next_layout(fit_TLE, prev)
        out.append(prev)
    return out


def full_replan(gpus: int, redundant: int, policy: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """next_layout for replan_layouts: planner.api.plan(policy) of the fit window's summed counts [L, E]."""
    def next_layout(fit_TLE: np.ndarray, _prev_LP: np.ndarray) -> np.ndarray:
        return plan(fit_TLE.sum(0), gpus, redundant, policy=policy).layout_LP
    return next_layout


def repaired_layout(fit_TLE: np.ndarray, current_LP: np.ndarray, gpus: int, max_moves: int,
                    sub_windows: int = DEFAULT_SUB_WINDOWS) -> np.ndarray:
    """current_LP [L, P] repaired toward balance on the fit steps [T, L, E] (split into ``sub_windows``
    windows) within ``max_moves`` expert copies in all (planner.repair.experts_copied); the layers where some
    GPU holds two replicas of one expert are held as they are. int64 [L, P]."""
    cur = np.asarray(current_LP, dtype=np.int64)
    repairable_L = ~duplicates_on_gpu(cur, gpus)
    if not repairable_L.any() or max_moves == 0:
        return cur
    windows_WLE = split_windows(fit_TLE, sub_windows)
    lay, _ = repair_curve(windows_WLE[:, repairable_L], cur[repairable_L], gpus, max_moves)
    out = cur.copy()
    out[repairable_L] = lay
    return out


def repair_layouts(counts_TLE: np.ndarray, current_LP: np.ndarray, bounds: Bounds, every: int, gpus: int,
                   max_moves: int = DEFAULT_MAX_MOVES, sub_windows: int = DEFAULT_SUB_WINDOWS) -> list[np.ndarray]:
    """The layout [L, P] in force on each scored window: repaired_layout of the window before, every window."""
    def next_layout(fit_TLE: np.ndarray, prev_LP: np.ndarray) -> np.ndarray:
        return repaired_layout(fit_TLE, prev_LP, gpus, max_moves, sub_windows)
    return replan_layouts(counts_TLE, current_LP, bounds, every, next_layout)


def advisor_layouts(counts_TLE: np.ndarray, current_LP: np.ndarray, bounds: Bounds, every: int, gpus: int,
                    redundant: int, max_moves: int = DEFAULT_MAX_MOVES, cost: CostModel | None = None,
                    horizon_steps: int = DEFAULT_HORIZON) -> list[np.ndarray]:
    """The layout [L, P] in force on each scored window under planner.advisor.advise (decision points at
    every, 2 x every, ..., each looking at the ``every`` steps before it), from current_LP."""
    sched = advise(counts_TLE, gpus, redundant, initial_LP=current_LP, every=every, window=every,
                   horizon_steps=horizon_steps, max_moves=max_moves, cost=cost)
    steps_C = [ch.step for ch in sched.changes]
    out = []
    for a, _ in bounds:
        k = int(np.searchsorted(steps_C, a, side="right")) - 1
        out.append(np.asarray(sched.changes[k].layout_LP, dtype=np.int64))
    return out

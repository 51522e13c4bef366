"""Steps to planner windows: the planner fits on a few windows of summed steps, not on every step.

Shape legend (README, Conventions): T steps, W windows, L layers, E logical experts.
"""
from __future__ import annotations

import numpy as np

MAX_WINDOWS = 16  # newest windows the robust policy balances at once; more steps are summed into these


def split_windows(counts_TLE, max_windows: int = MAX_WINDOWS) -> np.ndarray:
    """Per-step counts [T, L, E] (oldest first) -> float64 [W, L, E]: W = min(max_windows, T) contiguous
    windows of (nearly) equal step counts, each summed, oldest first. ValueError for another shape, no
    steps, or max_windows < 1."""
    counts_TLE = np.asarray(counts_TLE)
    if counts_TLE.ndim != 3 or counts_TLE.shape[0] == 0:
        raise ValueError(f"counts must be [steps >= 1, layers, experts], got shape {counts_TLE.shape}")
    if max_windows < 1:
        raise ValueError(f"max_windows must be >= 1, got {max_windows}")
    chunks = np.array_split(counts_TLE.astype(np.float64), min(max_windows, counts_TLE.shape[0]))
    return np.stack([chunk.sum(0) for chunk in chunks])

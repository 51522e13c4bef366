"""Time-series helpers: downsampling to a column budget, small integer payloads, rates.

Shape legend: T steps, X anything.
"""
from __future__ import annotations

import numpy as np


def bin_edges(num_steps: int, max_columns: int) -> np.ndarray:
    """Start index of each time bin: int64 [B+1] with B = min(T, max_columns) nearly equal bins."""
    if max_columns < 1:
        raise ValueError(f"max_columns must be at least 1, got {max_columns}")
    bins = min(num_steps, max_columns)
    return np.linspace(0, num_steps, bins + 1).round().astype(np.int64)


def downsample_sum(values_TX: np.ndarray, max_columns: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum consecutive steps into at most max_columns bins along axis 0.

    Returns (binned [B, ...], first step index of each bin [B]). Sums keep totals exact."""
    values_TX = np.asarray(values_TX)
    edges = bin_edges(values_TX.shape[0], max_columns)
    if values_TX.shape[0] == 0:
        return values_TX.copy(), np.zeros(0, dtype=np.int64)
    return np.add.reduceat(values_TX, edges[:-1], axis=0), edges[:-1]


def downsample_max(values_TX: np.ndarray, max_columns: int) -> tuple[np.ndarray, np.ndarray]:
    """Max of consecutive steps in at most max_columns bins along axis 0 (keeps spikes visible)."""
    values_TX = np.asarray(values_TX)
    edges = bin_edges(values_TX.shape[0], max_columns)
    if values_TX.shape[0] == 0:
        return values_TX.copy(), np.zeros(0, dtype=np.int64)
    return np.maximum.reduceat(values_TX, edges[:-1], axis=0), edges[:-1]


def small_ints(values: np.ndarray) -> np.ndarray:
    """Round non-negative values to the smallest unsigned integer dtype that holds them (uint8/16/32)."""
    values = np.asarray(values)
    if values.size and np.nanmin(values) < 0:
        raise ValueError("small_ints takes non-negative values")
    rounded = np.rint(np.nan_to_num(values, nan=0.0)) if values.dtype.kind == "f" else values
    peak = int(rounded.max()) if rounded.size else 0
    for dtype in (np.uint8, np.uint16, np.uint32):
        if peak <= np.iinfo(dtype).max:
            return rounded.astype(dtype)
    return rounded.astype(np.uint64)


def rate_per_s(times_s_T: np.ndarray, amounts_T: np.ndarray | None = None) -> float:
    """Steps (or amounts, e.g. tokens) per second over a window: items after the first divided by the
    time span; NaN with fewer than two steps or a zero span."""
    times_s_T = np.asarray(times_s_T, dtype=np.float64)
    if times_s_T.size < 2:
        return float("nan")
    span = float(times_s_T.max() - times_s_T.min())
    if span <= 0:
        return float("nan")
    if amounts_T is None:
        return (times_s_T.size - 1) / span
    order = np.argsort(times_s_T, kind="stable")
    return float(np.asarray(amounts_T, dtype=np.float64)[order][1:].sum() / span)

"""Where a series over steps or time has no data: the breaks a line chart leaves as gaps, and the rows it draws as
points. Used by every figure builder that draws lines over steps or time (figures.common.folded_lines and its
callers, figures.time, figures.staleness): each adds two columns to its dataset and keeps its spec fixed.

"segment" (unsigned int): rows of one segment are joined by the line; a new segment starts after a gap wider than
GAP_FACTOR x the series' usual spacing (the median step between consecutive x). "dot" (bool): the row is drawn as a
point, being alone between gaps (a line of one point is invisible), or the series having <= SPARSE_ROWS rows.
Shapes: x_T [T] step ids, seconds or datetimes, ascending; y_TS [T, S] values of S series (NaN: none).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moe_monitor.dashboard.analytics.series import small_ints

GAP_FACTOR = 2.0  # a step wider than this many usual spacings is a hole: one sample missing is not
SPARSE_ROWS = 50  # a series of at most this many rows gets a point at each


def _numeric(x_T) -> np.ndarray:
    x = np.asarray(x_T)
    if x.dtype.kind == "M":
        return x.astype("datetime64[ms]").astype(np.int64).astype(np.float64)
    return x.astype(np.float64)


def usual_spacing(x_T) -> float:
    """The median of the positive steps between consecutive x (NaN with fewer than two distinct x)."""
    steps = np.diff(_numeric(x_T))
    steps = steps[steps > 0]
    return float(np.median(steps)) if steps.size else float("nan")


def segments(x_T, gap_factor: float = GAP_FACTOR) -> np.ndarray:
    """Segment id of each row [T] (0 first, smallest unsigned dtype): one more after each step wider than
    gap_factor x usual_spacing(x_T). A step back or no step at all is never a gap."""
    if gap_factor <= 1.0:
        raise ValueError(f"gap_factor must be above 1 (a usual step is no gap), got {gap_factor}")
    x = _numeric(x_T)
    if x.size < 2:
        return np.zeros(x.size, dtype=np.uint8)
    usual = usual_spacing(x)
    gap = np.diff(x) > gap_factor * usual if np.isfinite(usual) else np.zeros(x.size - 1, dtype=bool)
    return small_ints(np.concatenate([[0], np.cumsum(gap)]))


def dots(segment_T: np.ndarray, y_TS: np.ndarray, sparse_rows: int = SPARSE_ROWS) -> np.ndarray:
    """bool [T]: rows drawn as points. A value no neighbour of its series joins (the neighbour is in another
    segment or has no value there) is one; so is every row with a value when at most sparse_rows rows have one."""
    segment_T = np.asarray(segment_T)
    y_TS = np.asarray(y_TS, dtype=np.float64)
    finite_TS = np.isfinite(y_TS[:, None] if y_TS.ndim == 1 else y_TS)
    if finite_TS.shape[0] != segment_T.size:
        raise ValueError(f"{finite_TS.shape[0]} rows of values for {segment_T.size} segment ids")
    same_T = segment_T[1:] == segment_T[:-1]  # row t and t+1 are joined when both have a value
    edge = np.zeros((1, finite_TS.shape[1]), dtype=bool)
    joined_next = np.vstack([same_T[:, None] & finite_TS[1:], edge])
    joined_prev = np.vstack([edge, same_T[:, None] & finite_TS[:-1]])
    alone_T = (finite_TS & ~joined_next & ~joined_prev).any(axis=1)
    present_T = finite_TS.any(axis=1)
    return alone_T | (present_T & (int(present_T.sum()) <= sparse_rows))


def with_gaps(frame: pd.DataFrame, values: Sequence[str], x: str = "x", by: Sequence[str] = ()) -> pd.DataFrame:
    """frame with "segment" and "dot" columns from its x column and value columns, each group of the columns
    `by` (one line each) on its own; rows and their order unchanged."""
    segment_T = np.zeros(len(frame), dtype=np.uint32)
    dot_T = np.zeros(len(frame), dtype=bool)
    groups = frame.groupby(list(by), sort=False).indices.values() if by else [np.arange(len(frame))]
    for rows in groups:
        part = frame.iloc[rows]
        segment_T[rows] = segments(part[x].to_numpy())
        dot_T[rows] = dots(segment_T[rows], part[list(values)].to_numpy(dtype=np.float64))
    return frame.assign(segment=small_ints(segment_T), dot=dot_T)

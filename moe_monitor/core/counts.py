"""Expert counts as input: the one check every reader of counts files applies (the planner's inputs, trace
conversion of SGLang's logical_count). Pure: numpy only.

Shape legend: W windows, L layers, E logical experts.
"""
from __future__ import annotations

import numpy as np

MAX_COUNT_SUM = 1e30         # all counts together: sums and the float32 screens (max 3.4e38) stay finite
MIN_ROW_SUM = 1e-30          # a layer's (window's) counts: 0 or at least this (tinier means underflow)
_MAX_NEST = 3                # [windows][layers][experts]


def _numbers_only(obj, name: str) -> None:
    """ValueError unless obj is numbers (int or float, never bool or str) nested at most _MAX_NEST lists deep,
    or numeric numpy arrays. Walks lists iteratively; the message names the first offender's position."""
    stack: list[tuple[object, tuple[int, ...]]] = [(obj, ())]
    while stack:
        item, where = stack.pop()
        if isinstance(item, (list, tuple)):
            if len(where) >= _MAX_NEST:
                raise ValueError(f"{name} must be [layers][experts] or [windows][layers][experts]: lists nest "
                                 f"deeper than {_MAX_NEST} levels")
            stack.extend(reversed([(x, (*where, i)) for i, x in enumerate(item)]))
        elif isinstance(item, np.ndarray):
            _numeric_dtype(item.dtype, name)
        elif isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, float, np.integer, np.floating)):
            at = "".join(f"[{i}]" for i in where)
            raise ValueError(f"{name} must hold numbers only, found {type(item).__name__} {short_repr(item)}"
                             + (f" at {at}" if at else ""))


def _numeric_dtype(dtype: np.dtype, name: str) -> None:
    if dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold numbers only (int or float), got an array of {dtype}")


def short_repr(item) -> str:
    text = repr(item)
    return text if len(text) <= 40 else text[:37] + "..."


def as_counts(counts, name: str = "counts", ndim: tuple[int, ...] = (2,)) -> np.ndarray:
    """Validate expert counts and return them as float64 (shape [L, E] or [W, L, E] per ``ndim``).

    ValueError (never another exception) unless counts are ints or floats (bools and strings are refused, not
    converted), rectangular, finite and >= 0, summing to at most MAX_COUNT_SUM in all, with every layer of
    every window summing to 0 or at least MIN_ROW_SUM."""
    if isinstance(counts, np.ndarray):
        _numeric_dtype(counts.dtype, name)
    else:
        _numbers_only(counts, name)
    try:
        arr = np.asarray(counts, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{name} must be a rectangular array of numbers [layers][experts] or "
                         f"[windows][layers][experts] within the float range ({exc})") from None
    if arr.ndim not in ndim:
        want = " or ".join(f"{d}-D" for d in ndim)
        raise ValueError(f"{name} must be {want} (layers x experts), got shape {arr.shape}")
    if arr.size == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    if np.any(arr < 0):
        raise ValueError(f"{name} contains negative counts")
    with np.errstate(over="ignore"):
        rows = arr.sum(-1)
        total = rows.sum()
    if not total <= MAX_COUNT_SUM:
        raise ValueError(f"{name} sum to {total:.3g}, above the planner's limit of {MAX_COUNT_SUM:g}: "
                         "scale them down (only their ratios matter)")
    tiny = (rows > 0) & (rows < MIN_ROW_SUM)
    if tiny.any():
        where = "".join(f"[{int(i)}]" for i in np.argwhere(tiny)[0])
        raise ValueError(f"{name}{where} sum to {rows[tiny].flat[0]:.3g}, below the planner's limit of "
                         f"{MIN_ROW_SUM:g} for a layer with tokens: scale them up (only their ratios matter)")
    return arr


CHUNK_STEPS = 512  # steps scored at once by the replaying tools (bounds their [steps, L, P] temporaries)

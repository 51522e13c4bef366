"""The checks a step window applies to every record before anything changes: plain numbers within the bounds
of core/keys.py, whatever source built the record (wire's decoders always pass them; a hand-built or corrupt
record gets one ValueError naming what is wrong)."""
from __future__ import annotations

import math
import operator
from typing import NamedTuple

import numpy as np

from moe_monitor import core

PHASE_CODE = {name: code for code, name in enumerate(core.PHASES)}


def bounded_int(value, name: str, lo: int, hi: int) -> int:
    """value as an int with lo <= value < hi (numpy integers welcome, bools not); ValueError otherwise."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
    if isinstance(value, bool) or not lo <= number < hi:
        raise ValueError(f"{name} is outside {lo}..{hi - 1}")
    return int(number)



def check_record(rec: core.StepRecord) -> None:
    """Raise ValueError naming what is wrong unless rec's step, rank, world, tokens, dropped count, time and phase
    are plain numbers within the bounds of core/keys.py and its instance id a short string. (Records from
    core.decode_step always pass; this guards the reader against any other source.)"""
    bounded_int(rec.step, "step", 0, core.MAX_STEP)
    rank = bounded_int(rec.rank, "rank", 0, core.MAX_WORLD)
    world = bounded_int(rec.world_size, "world size", 1, core.MAX_WORLD + 1)
    if rank >= world:
        raise ValueError(f"rank {rank} is not below world size {world}")
    bounded_int(rec.tokens, "tokens", 0, core.MAX_TOKENS)
    bounded_int(rec.dropped_steps, "dropped steps", 0, core.MAX_STEP)
    _checked_time(rec.time_s)
    _checked_phase(rec.phase)
    _checked_instance(rec.instance, "collector")


class CheckedStep(NamedTuple):
    """An assembled step's fields as plain values within the bounds of core/keys.py (check_aggregate): ranks_R
    int64 [R] ascending; tokens summed over the ranks; dropped_R int64 [R]; phase_code the index in core.PHASES."""

    step: int
    ranks_R: np.ndarray
    world: int
    tokens: int
    dropped_R: np.ndarray
    time_s: float
    phase_code: int
    late: bool


def check_counts(counts: object, shape: tuple[int, int] | None, what: str, highest: int, why: str) -> np.ndarray:
    """counts as an integer array [L, E] (of `shape` when given) with values in 0..highest; ValueError naming
    what is wrong otherwise."""
    if not isinstance(counts, np.ndarray) or counts.ndim != 2 or shape is not None and counts.shape != shape:
        found = counts.shape if isinstance(counts, np.ndarray) else type(counts).__name__
        raise ValueError(f"{what}: counts are {found}, this run is {list(shape) if shape else '[L, E]'}")
    if counts.dtype.kind not in "iu":
        raise ValueError(f"counts must be integers, got {counts.dtype}")
    if counts.size and int(counts.min()) < 0:
        raise ValueError("counts contain negative values")
    if counts.size and counts.dtype != np.int32 and int(counts.max()) > highest:
        raise ValueError(f"counts must lie in 0..{highest} {why}")
    return counts


def check_aggregate(rec: core.AggregateRecord) -> CheckedStep:
    """The CheckedStep of an assembled step (core.AggregateRecord): ranks_R int64
    [R] ascending, distinct, below the world size, R >= 1; tokens the sum of tokens_R [R] (each below
    core.MAX_TOKENS); dropped_R int64 [R] (each below core.MAX_STEP); the instance (the aggregator's epoch)
    short text. ValueError naming what is wrong. (Records from core.decode_aggregate always pass.)"""
    step = bounded_int(rec.step, "step", 0, core.MAX_STEP)
    world = bounded_int(rec.world_size, "world size", 1, core.MAX_WORLD + 1)
    ranks = _int_vector(rec.ranks_R, "ranks")
    if ranks.size == 0 or int(ranks.min()) < 0 or int(ranks.max()) >= world or bool(np.any(np.diff(ranks) <= 0)):
        raise ValueError(f"ranks must be one or more distinct ranks 0..{world - 1}, ascending")
    tokens_R, dropped_R = _int_vector(rec.tokens_R, "tokens"), _int_vector(rec.dropped_R, "dropped steps")
    if tokens_R.shape != ranks.shape or dropped_R.shape != ranks.shape:
        raise ValueError(f"tokens and dropped steps must have one value per rank ({ranks.size})")
    if int(tokens_R.min()) < 0 or int(tokens_R.max()) >= core.MAX_TOKENS:
        raise ValueError(f"a rank's tokens are outside 0..{core.MAX_TOKENS - 1}")
    if int(dropped_R.min()) < 0 or int(dropped_R.max()) >= core.MAX_STEP:
        raise ValueError(f"a rank's dropped steps are outside 0..{core.MAX_STEP - 1}")
    time_s, code = _checked_time(rec.time_s), _checked_phase(rec.phase)
    _checked_instance(rec.instance, "aggregator")
    if not isinstance(rec.late, (bool, np.bool_)):
        raise ValueError(f"late must be a bool, got {type(rec.late).__name__}")
    return CheckedStep(step, ranks, world, int(tokens_R.sum()), dropped_R, time_s, code, bool(rec.late))


def _int_vector(values: object, name: str) -> np.ndarray:
    """values as int64 [N] (an integer numpy array of one dimension); ValueError otherwise."""
    if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer array")
    if values.dtype.kind == "u" and values.size and int(values.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} are out of range")
    return values.astype(np.int64, copy=False)


def _checked_time(value: object) -> float:
    try:
        time_s = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"time must be a number, got {type(value).__name__}") from None
    if not (math.isfinite(time_s) and abs(time_s) < core.MAX_TIME_S):
        raise ValueError(f"time {time_s} is not a finite time below {core.MAX_TIME_S:g} s")
    return time_s


def _checked_phase(phase: object) -> int:
    code = PHASE_CODE.get(phase) if isinstance(phase, str) else None
    if code is None:
        raise ValueError(f"unknown phase {str(phase)[:40]!r}")
    return code


def _checked_instance(instance: object, whose: str) -> None:
    if not isinstance(instance, str) or len(instance) > core.MAX_NAME_CHARS:
        raise ValueError(f"{whose} instance id must be text of at most {core.MAX_NAME_CHARS} characters")

"""Which phase a window's run spends its time in: each step's wall time (the gap since the step before it)
summed per phase, and the phase the pages open on ("auto"). Pure: numpy only. Shape legend: T steps."""
from __future__ import annotations

import numpy as np

from moe_monitor import core

AUTO = "auto"
SINGLE = ("decode", "prefill", "train")  # the phases "auto" may choose; mixed and unknown steps mean "both"
KEEP = 0.8  # the phase shown stays until another takes 1 / KEEP times its time


def time_by_phase(time_s_T: np.ndarray, phase_code_T: np.ndarray) -> dict[str, float]:
    """Seconds per phase name (core.PHASES) of steps ordered oldest first: a step's time is the gap since the
    step before it, the first step's the median gap (0 with one step); negative gaps (clock steps) count 0."""
    time_s_T = np.asarray(time_s_T, dtype=np.float64)
    codes = np.asarray(phase_code_T, dtype=np.int64)
    if time_s_T.size == 0:
        return {}
    gaps = np.maximum(np.diff(time_s_T), 0.0)
    first = float(np.median(gaps)) if gaps.size else 0.0
    seconds_T = np.concatenate([[first], gaps])
    if not np.isfinite(seconds_T).all() or seconds_T.sum() <= 0:  # no usable clock: count steps instead
        seconds_T = np.ones_like(seconds_T)
    by_code = np.bincount(codes, weights=seconds_T, minlength=len(core.PHASES))
    return {name: float(by_code[i]) for i, name in enumerate(core.PHASES) if by_code[i] > 0}


def main_phase(seconds: dict[str, float], previous: str = "") -> str:
    """The phase with most of the time among SINGLE, "both" when mixed or unknown steps take more (or nothing
    is known). previous (the last tick's answer) stays while it holds at least KEEP of the leader's time, so
    a run near half and half does not flip the pages every tick."""
    if not seconds:
        return "both"
    name = max(seconds, key=lambda k: seconds[k])
    if previous in SINGLE and seconds.get(previous, 0.0) >= KEEP * seconds[name]:
        return previous
    return name if name in SINGLE else "both"


def shares_line(seconds: dict[str, float]) -> str:
    """'decode 93% · prefill 7%' of the window's time, largest first."""
    total = sum(seconds.values())
    if total <= 0:
        return ""
    return " · ".join(f"{name} {value / total:.0%}" for name, value in
                      sorted(seconds.items(), key=lambda kv: -kv[1]))

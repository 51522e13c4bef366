"""Replay a trace against a layout schedule and charge every step the time it loses (docs/planner.md, Cost model).

    straggler_s[t] = sum_l (max_g load[t, l, g] - mean_g load[t, l, g]) * seconds_per_token_slot
    migration_s    = experts_copied(A, B) * bytes_per_expert * 8 / (link_gbps * 1e9)    (serving waits)
GPU loads: core.loadmodel's even split, or a ``dispatch`` policy's (core.dispatch). Defaults (CostModel) price
DeepSeek-V3: 2.2e-7 s per token-slot, 88 MB per expert in bf16; step-time equivalents divide by the trace's mean
perfectly balanced expert time per step. With a core.costmodel TimeModel (CostModel.in_time) the straggler is
priced in predicted time instead: sum over layers of the slowest minus the mean GPU's seconds. A schedule is changes (step, layout_LP), the first at step 0, steps
strictly increasing trace indices; a change is in force and paid from its step (planner/schedule.py).
Shapes: T steps, L layers, E logical experts, P slots, G GPUs, C changes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moe_monitor.core.costmodel import TimeModel
from moe_monitor.core.counts import as_counts
from moe_monitor.core.dispatch import DispatchModel, check_policy
from moe_monitor.core.loadmodel import gpu_loads

from .budget import bytes_per_expert
from .loads import CHUNK_STEPS
from .repair import experts_copied
from .schedule import as_schedule, check_schedule
from .sizes import DEEPSEEK_V3
from .timecost import slowest_and_mean_s

__all__ = ["CostModel", "SimResult", "simulate", "straggler_tokens", "DEFAULT_TFLOPS", "DEFAULT_LINK_GBPS"]
DEFAULT_TFLOPS = 400.0        # effective expert GEMM throughput behind the default seconds_per_token_slot
DEFAULT_LINK_GBPS = 400.0     # Gb/s shared by a migration's copies (one 400 Gb/s NIC: 50 GB/s)


def _positive(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


@dataclass(frozen=True)
class CostModel:
    """Prices of the simulator (see the module docstring). Defaults: DeepSeek-V3 sizes, 400 TFLOP/s, 400 Gb/s."""
    seconds_per_token_slot: float = (2 * 3 * DEEPSEEK_V3.hidden_size * DEEPSEEK_V3.moe_intermediate_size
                                     / (DEFAULT_TFLOPS * 1e12))
    link_gbps: float = DEFAULT_LINK_GBPS
    bytes_per_expert: int = bytes_per_expert(DEEPSEEK_V3.hidden_size, DEEPSEEK_V3.moe_intermediate_size,
                                             DEEPSEEK_V3.dtype_bytes)
    step_seconds: float | None = None
    time_model: TimeModel | None = None

    def __post_init__(self):
        _positive(self.seconds_per_token_slot, "seconds per token-slot")
        _positive(self.link_gbps, "link bandwidth (Gb/s)")
        _positive(self.bytes_per_expert, "bytes per expert")
        if self.step_seconds is not None:
            _positive(self.step_seconds, "step seconds")

    @classmethod
    def for_sizes(cls, hidden: int = DEEPSEEK_V3.hidden_size,
                  moe_intermediate: int = DEEPSEEK_V3.moe_intermediate_size,
                  dtype_bytes: int = DEEPSEEK_V3.dtype_bytes, tflops: float = DEFAULT_TFLOPS,
                  link_gbps: float = DEFAULT_LINK_GBPS, step_seconds: float | None = None) -> CostModel:
        """Cost model of an expert of these sizes on GPUs of ``tflops`` effective TFLOP/s."""
        tflops = _positive(tflops, "TFLOP/s")
        bpe = bytes_per_expert(hidden, moe_intermediate, dtype_bytes)
        return cls(seconds_per_token_slot=2 * 3 * hidden * moe_intermediate / (tflops * 1e12),
                   link_gbps=link_gbps, bytes_per_expert=bpe, step_seconds=step_seconds)

    @classmethod
    def in_time(cls, model: TimeModel, link_gbps: float = DEFAULT_LINK_GBPS,
                step_seconds: float | None = None) -> CostModel:
        """Prices in predicted time (core.costmodel): straggler seconds from the model, an expert's bytes from
        its dimensions; seconds_per_token_slot is the model's FLOPs per token at its achieved peak."""
        return cls(seconds_per_token_slot=model.dims.flops_per_token / model.peak_flops, link_gbps=link_gbps,
                   bytes_per_expert=int(model.dims.expert_bytes), step_seconds=step_seconds, time_model=model)

    @property
    def pricing(self) -> str:
        """What the straggler is priced in, for a report."""
        if self.time_model is None:
            return f"token-slots at {self.seconds_per_token_slot:.3g} s each"
        return f"predicted time for {self.time_model.label()}"

    def migration_seconds(self, copies: int) -> float:
        """Seconds serving waits while ``copies`` experts move."""
        return copies * self.bytes_per_expert * 8 / (self.link_gbps * 1e9)

    def straggler_seconds(self, counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int,
                          dispatch: str = "even") -> np.ndarray:
        """float64 [T]: per step, the seconds the other GPUs wait for the busiest (summed over layers)."""
        if self.time_model is None:
            return straggler_tokens(counts_TLE, layout_LP, gpus, dispatch) * self.seconds_per_token_slot
        slowest_TL, mean_TL = slowest_and_mean_s(counts_TLE, layout_LP, gpus, dispatch, self.time_model)
        return np.maximum(slowest_TL - mean_TL, 0.0).sum(-1)

    def busiest_seconds(self, counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int,
                        dispatch: str = "even") -> np.ndarray:
        """float64 [T]: per step, the busiest GPU's seconds summed over layers (the step's expert time)."""
        if self.time_model is None:
            busiest_tokens = straggler_tokens(counts_TLE, layout_LP, gpus, dispatch) + counts_TLE.sum((1, 2)) / gpus
            return busiest_tokens * self.seconds_per_token_slot
        return slowest_and_mean_s(counts_TLE, layout_LP, gpus, dispatch, self.time_model)[0].sum(-1)


def straggler_tokens(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int, dispatch: str = "even") -> np.ndarray:
    """Per step, sum over layers of (max_g - mean_g) GPU load in tokens, float64 [T] (counts [T, L, E]), the GPU
    loads under the ``dispatch`` policy (core.dispatch; even: core.loadmodel's split)."""
    check_policy(dispatch)
    model = None if dispatch == "even" else DispatchModel(layout_LP, counts_TLE.shape[2], gpus, dispatch)
    out = np.empty(counts_TLE.shape[0])
    for a in range(0, counts_TLE.shape[0], CHUNK_STEPS):
        chunk = counts_TLE[a:a + CHUNK_STEPS]
        loads = gpu_loads(chunk, layout_LP, gpus) if model is None else model.gpu_loads(chunk)   # [t, L, G]
        # max >= mean up to rounding: a mean one ulp above the max must not make a cost negative
        out[a:a + CHUNK_STEPS] = np.maximum(loads.max(-1) - loads.mean(-1), 0.0).sum(-1)
    return out


@dataclass(frozen=True)
class SimResult:
    """straggler_s_T [T]; per change applied (C of them, the first at step 0): change_steps_C, moves_C,
    migration_s_C (0 for the first). ``step_seconds``: the unit of the step-time equivalents."""
    straggler_s_T: np.ndarray
    change_steps_C: np.ndarray
    moves_C: np.ndarray
    migration_s_C: np.ndarray
    step_seconds: float
    ignored_changes: int = 0
    pricing: str = ""

    @property
    def straggler_s(self) -> float:
        return float(self.straggler_s_T.sum())

    @property
    def migration_s(self) -> float:
        return float(self.migration_s_C.sum())

    @property
    def total_s(self) -> float:
        return self.straggler_s + self.migration_s

    @property
    def moves(self) -> int:
        return int(self.moves_C.sum())

    def summary(self) -> dict:
        eq = (lambda s: s / self.step_seconds) if self.step_seconds > 0 else (lambda s: None)
        return {"steps": int(self.straggler_s_T.size), "changes": int(self.change_steps_C.size - 1),
                "moves": self.moves, "straggler_s": self.straggler_s, "migration_s": self.migration_s,
                "total_lost_s": self.total_s, "step_seconds": self.step_seconds,
                "total_lost_steps": eq(self.total_s), "straggler_steps": eq(self.straggler_s),
                "migration_steps": eq(self.migration_s), "ignored_changes": self.ignored_changes,
                "pricing": self.pricing}

    def to_json(self) -> dict:
        return {"summary": self.summary(),
                "changes": [{"step": int(s), "moves": int(m), "migration_s": float(x)}
                            for s, m, x in zip(self.change_steps_C, self.moves_C, self.migration_s_C)],
                "straggler_s_per_step": self.straggler_s_T.tolist()}


def simulate(counts_TLE, schedule, cost: CostModel | None = None, gpus: int | None = None,
             dispatch: str = "even") -> SimResult:
    """Replay per-step counts [T, L, E] (T >= 1) under ``schedule`` (a Schedule, or (step, layout_LP) pairs
    with ``gpus``) and price every step (module docstring), GPU loads under the ``dispatch`` policy. ValueError
    for counts or layouts that do not fit together."""
    check_policy(dispatch)
    cost = CostModel() if cost is None else cost
    c = as_counts(counts_TLE, "counts", ndim=(3,))
    T, L, E = c.shape
    sched = as_schedule(schedule, gpus)
    check_schedule(sched, num_experts=E, layers=L)
    g = sched.gpus
    applied = [ch for ch in sched.changes if ch.step < T]
    straggler = np.empty(T)
    moves, migration = [0], [0.0]
    bounds = [ch.step for ch in applied] + [T]
    for k, ch in enumerate(applied):
        lay = np.asarray(ch.layout_LP, dtype=np.int64)
        straggler[bounds[k]:bounds[k + 1]] = cost.straggler_seconds(c[bounds[k]:bounds[k + 1]], lay, g, dispatch)
        if k:
            m = experts_copied(np.asarray(applied[k - 1].layout_LP, dtype=np.int64), lay, g)
            moves.append(m)
            migration.append(cost.migration_seconds(m))
    step_s = cost.step_seconds
    if step_s is None:
        step_s = float(c.sum((1, 2)).mean() / g * cost.seconds_per_token_slot)
    return SimResult(straggler_s_T=straggler,
                     change_steps_C=np.array([ch.step for ch in applied], dtype=np.int64),
                     moves_C=np.array(moves, dtype=np.int64), migration_s_C=np.array(migration),
                     step_seconds=step_s, ignored_changes=len(sched.changes) - len(applied), pricing=cost.pricing)

"""The cost model (core.costmodel) over recorded per-step counts: the time verdict of a layout under a dispatch
policy, in strict JSON for score, diagnose and the exporter, or why there is none (no model dimensions, no GPU
profile: the token figures stand alone then; core.costmodel.time_model says which). Pure numpy;
docs/costmodel.md has the formula.

Shapes: T steps, L layers, E experts, P slots, G GPUs.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from moe_monitor.core.costmodel import GpuTimes, TimeModel, Verdict, verdict
from moe_monitor.core.dispatch import DispatchModel

MAX_TIME_CELLS = 1 << 21  # (step, layer, GPU) cells one verdict holds at most: older steps beyond are left out


def chunked_times(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int, dispatch: str,
                  model: TimeModel) -> Iterator[tuple[int, GpuTimes]]:
    """(index of its first step, predicted times [t, L, G]) of counts [T, L, E] under layout_LP [L, P] and a
    dispatch policy, DispatchModel.steps_per_chunk steps at a time (the slot loads' temporaries stay bounded)."""
    counts = np.asarray(counts_TLE, dtype=np.float64)
    dispatch_model = DispatchModel(layout_LP, counts.shape[2], gpus, dispatch)
    chunk = dispatch_model.steps_per_chunk
    for a in range(0, counts.shape[0], chunk):
        yield a, model.gpu_times(dispatch_model.slot_loads(counts[a:a + chunk]))


def slowest_and_mean_s(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int, dispatch: str,
                       model: TimeModel) -> np.ndarray:
    """float64 [2, T, L]: the slowest and the mean GPU's predicted seconds of each step and layer."""
    out = np.empty((2,) + np.shape(counts_TLE)[:2])
    for a, times in chunked_times(counts_TLE, layout_LP, gpus, dispatch, model):
        total = times.total_s
        out[0, a:a + total.shape[0]], out[1, a:a + total.shape[0]] = total.max(-1), total.mean(-1)
    return out


def gpu_times_of(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int, dispatch: str, model: TimeModel,
                 max_cells: int = MAX_TIME_CELLS) -> GpuTimes:
    """Predicted times [T', L, G] of the newest T' = min(T, max_cells // (L x G)) steps of counts [T, L, E]
    under layout_LP [L, P] and a dispatch policy (chunked_times)."""
    T, L, _ = counts_TLE.shape
    keep = max(1, min(T, max_cells // max(1, L * gpus)))
    parts = [times for _, times in chunked_times(counts_TLE[T - keep:], layout_LP, gpus, dispatch, model)]
    fields = ("weights_s", "flops_s", "comm_s", "active_slots", "tokens")
    joined = {name: np.concatenate([getattr(p, name) for p in parts]) for name in fields}
    return GpuTimes(overhead_s=model.profile.overhead_s, **joined)


def time_verdict(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int, dispatch: str, model: TimeModel,
                 max_cells: int = MAX_TIME_CELLS) -> tuple[Verdict, int]:
    """(core.costmodel.verdict, steps it covers) of the newest steps of counts [T, L, E] (gpu_times_of)."""
    times = gpu_times_of(counts_TLE, layout_LP, gpus, dispatch, model, max_cells)
    return verdict(times, ridge_tokens=model.ridge_tokens), int(times.tokens.shape[0])


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def verdict_json(found: Verdict, model: TimeModel, steps: int, total_steps: int) -> dict:
    """The `time` object of score and diagnose: seconds per step (sums over layers), the straggler, why."""
    return {"available": True, "predicted_for": model.label(), "gpu_profile": model.profile.name,
            "profile_source": model.profile.source, "gpus": model.gpus, "nodes": model.nodes,
            "steps": steps, "steps_left_out": total_steps - steps,
            "moe_s_per_step": found.moe_s, "lost_s_per_step": found.lost_s, "lost_share": found.lost_share,
            "straggler_gpu": found.gpu, "cause": found.cause, "why": found.why, "speedup": found.speedup,
            "memory_bound_share": _finite(found.memory_bound_share),
            "ridge_tokens_per_expert": _finite(model.ridge_tokens)}


def unavailable_json(reasons: list[str], hint: str = "") -> dict:
    """The `time` object when no time figure can be given: which inputs are missing, and how to give them."""
    return {"available": False, "reason": ", ".join(reasons), "missing": list(reasons), "hint": hint}


def time_payload(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int, dispatch: str,
                 model: TimeModel | list[str], hint: str = "") -> dict:
    """verdict_json of the counts under the layout when model is a TimeModel, unavailable_json otherwise."""
    if not isinstance(model, TimeModel):
        return unavailable_json(model, hint)
    found, steps = time_verdict(counts_TLE, layout_LP, gpus, dispatch, model)
    return verdict_json(found, model, steps, int(counts_TLE.shape[0]))

"""The load model: GPU load of a step under a layout, and balancedness; every reader (planner, aggregator
rollups, dashboard, exporter, traces) uses these. Pure: numpy only. Definitions: docs/definitions.md.

``gpu_loads`` (slot form, the planner's hot path) and ``gpu_weights`` + ``weighted_loads`` (matmul form, many
steps under one layout) give the same loads (even split across replicas); ``balancedness`` is mean/max, NaN
where every GPU is idle.

Shape legend: L layers, E logical experts, P physical slots, G GPUs, S = P // G slots per GPU, T steps, X any
leading axes; ``layout_LP[l, p]`` = logical expert of slot p, which lives on GPU ``p // S``, or -1 (vLLM's
unused slot, core.layouts.UNUSED): it holds nothing, counts as no replica and serves no token.
"""
from __future__ import annotations

import numpy as np

from .meta import check_layout_map


def replica_counts(layout_LP: np.ndarray, num_experts: int) -> np.ndarray:
    """Replicas per logical expert, int64 [L, E] (an unused slot, -1, is no replica)."""
    layout_LP = np.asarray(layout_LP, dtype=np.int64)
    L = layout_LP.shape[0]
    offs = (np.arange(L, dtype=np.int64) * num_experts)[:, None]
    ids = layout_LP + offs
    ids = ids[layout_LP >= 0] if _has_unused(layout_LP) else ids.ravel()
    return np.bincount(ids, minlength=L * num_experts).reshape(L, num_experts)


def _has_unused(layout_LP: np.ndarray) -> bool:
    return bool(layout_LP.size) and int(layout_LP.min()) < 0


def slot_weights(counts_LE: np.ndarray, layout_LP: np.ndarray) -> np.ndarray:
    """Per-slot load count[e] / replicas[e]: [L, P], or [X, L, P] for counts [X, L, E] (steps or windows); 0 in
    an unused slot (-1)."""
    E = counts_LE.shape[-1]
    layout_LP = np.asarray(layout_LP, dtype=np.int64)
    rep_LE = replica_counts(layout_LP, E)
    per_rep = counts_LE / np.maximum(rep_LE, 1)
    unused = _has_unused(layout_LP)
    lay = np.maximum(layout_LP, 0) if unused else layout_LP
    if per_rep.ndim == 2:
        w = np.take_along_axis(per_rep, lay, axis=1)
    else:
        w = np.take_along_axis(per_rep, np.broadcast_to(lay, per_rep.shape[:2] + lay.shape[1:]), axis=2)
    if unused:
        w[..., layout_LP < 0] = 0.0
    return w


def gpu_loads(counts_LE: np.ndarray, layout_LP: np.ndarray, gpus: int) -> np.ndarray:
    """GPU loads [L, G] (or [X, L, G] for counts [X, L, E], steps or windows) under ``layout_LP``."""
    w = slot_weights(np.asarray(counts_LE, dtype=np.float64), np.asarray(layout_LP, dtype=np.int64))
    return w.reshape(w.shape[:-1] + (gpus, -1)).sum(-1)


def balancedness(loads_XG) -> np.ndarray:
    """eta = mean/max over the last axis (GPUs), [..., G] -> float64 [...]; NaN where every GPU has load 0.

    float32 loads (the step window's) take a path that gives the same values bit for bit without first copying
    the whole array to float64 (the max is exact in float32, the mean accumulates in float64 per row)."""
    if not (isinstance(loads_XG, np.ndarray) and loads_XG.dtype == np.float32):
        loads_XG = np.asarray(loads_XG, dtype=np.float64)
    if loads_XG.ndim < 1 or loads_XG.shape[-1] == 0:
        raise ValueError(f"loads need a GPU axis last, got shape {loads_XG.shape}")
    peak = loads_XG.max(axis=-1)
    mean = loads_XG.mean(axis=-1, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(peak > 0, mean / np.where(peak > 0, peak, 1.0), np.nan)


def imbalance(loads_XG) -> np.ndarray:
    """max/mean over the last axis = 1/eta, [..., G] -> float64 [...]; NaN where every GPU has load 0."""
    return 1.0 / balancedness(loads_XG)


def validated_layout(layout_LP, num_experts: int, gpus: int, *, unused: bool = False) -> np.ndarray:
    """physical_to_logical_map [L][P] (lists or array) -> int64 [L, P]: core.meta.check_layout_map on one node,
    L being the map's own, after integral floats become ints. ValueError as that check says (unused=True: -1
    is an unused slot)."""
    try:
        lay = np.asarray(layout_LP)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"physical_to_logical_map must be a rectangular [layers][slots] integer list: {exc}") from None
    if lay.dtype == object or lay.ndim != 2 or lay.shape[1] == 0:
        raise ValueError(f"physical_to_logical_map must be a rectangular [layers][slots] integer list, "
                         f"got shape {lay.shape}")
    if not np.issubdtype(lay.dtype, np.integer) and (
            not np.issubdtype(lay.dtype, np.number) or not np.all(np.equal(np.mod(lay, 1), 0))):
        raise ValueError("physical_to_logical_map holds non-integer expert ids")
    lay = lay.astype(np.int64)
    if not unused and lay.min() == -1 and lay.max() < num_experts:
        raise ValueError("the layout leaves slots unused (-1); this reader needs an expert in every slot")
    return check_layout_map(lay, gpus, 1, lay.shape[0], num_experts, unused=unused)


def gpu_weights(layout_LP, num_experts: int, gpus: int) -> np.ndarray:
    """float32 [L, E, G]: share of expert e's tokens that GPU g serves in layer l (even split over its
    replicas); every (l, e) row sums to 1. The layout is checked by validated_layout(); an unused slot (-1)
    serves nothing."""
    lay = validated_layout(layout_LP, num_experts, gpus, unused=True)
    rep_LE = replica_counts(lay, num_experts)
    L, P = lay.shape
    gpu_P = np.arange(P) // (P // gpus)
    flat = (np.arange(L)[:, None] * num_experts + lay) * gpus + gpu_P[None, :]
    used = lay >= 0
    share_LP = 1.0 / np.take_along_axis(rep_LE, np.maximum(lay, 0), axis=1)
    weights = np.bincount(flat[used], weights=share_LP[used], minlength=L * num_experts * gpus)
    return weights.reshape(L, num_experts, gpus).astype(np.float32)


def weighted_loads(counts_TLE, weights_LEG: np.ndarray) -> np.ndarray:
    """float32 [T, L, G] GPU loads of each step and layer from counts [T, L, E] and gpu_weights() [L, E, G]
    (the matmul form of gpu_loads, for many steps under one layout)."""
    counts_TLE = np.asarray(counts_TLE)
    if counts_TLE.ndim != 3:
        raise ValueError(f"counts must be [steps, layers, experts], got shape {counts_TLE.shape}")
    if counts_TLE.shape[1:] != weights_LEG.shape[:2]:
        raise ValueError(f"counts are [L, E] = {counts_TLE.shape[1:]}, the layout is for {weights_LEG.shape[:2]}")
    loads_LTG = np.matmul(counts_TLE.astype(np.float32).transpose(1, 0, 2), weights_LEG)
    return np.ascontiguousarray(loads_LTG.transpose(1, 0, 2))

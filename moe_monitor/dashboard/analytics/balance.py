"""Balancedness, percentiles and stragglers from GPU loads.

balancedness eta = mean/max of GPU loads (per layer per step); imbalance = max/mean = 1/eta; idle share = 1 - eta.
A layer with no tokens at all has no balancedness: NaN, ignored by the summaries.
p99 (and every percentile here) is numpy's default linear interpolation between closest ranks.

Shape legend: T steps, L layers, G GPUs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from moe_monitor.core.loadmodel import balancedness, imbalance  # noqa: F401  (the load model's, re-exported for the views)

STATS_CHUNK_BYTES = 16 << 20  # float64 copies window_stats makes at a time


def nan_percentiles(values: np.ndarray, qs: tuple[float, ...]) -> tuple[float, ...]:
    """Percentiles (0-100) of the finite values; NaN for each when there are none."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return tuple(float("nan") for _ in qs)
    return tuple(float(v) for v in np.percentile(finite, qs))


@dataclass(frozen=True)
class LayerSpread:
    """min / p50 / p90 of a per-layer quantity across layers (as vLLM's balancedness gauges report)."""

    min: float
    p50: float
    p90: float


def across_layers(eta_L: np.ndarray) -> LayerSpread:
    """Summarise per-layer balancedness [L] by its min, p50 and p90 across layers (NaN layers ignored)."""
    eta_L = np.asarray(eta_L, dtype=np.float64)
    if eta_L.ndim != 1:
        raise ValueError(f"expected one value per layer, got shape {eta_L.shape}")
    lo, p50, p90 = nan_percentiles(eta_L, (0.0, 50.0, 90.0))
    return LayerSpread(min=lo, p50=p50, p90=p90)


@dataclass(frozen=True)
class GpuWindowStats:
    """Per-GPU statistics of its per-step load over a window: arrays [G]."""

    max_G: np.ndarray
    mean_G: np.ndarray
    p99_G: np.ndarray


def window_stats(loads_TG: np.ndarray) -> GpuWindowStats:
    """Per-GPU max, mean and p99 (float64 [G] each) of the per-step load [T, G] over the T steps, computed in
    float64 a block of GPUs at a time (at most STATS_CHUNK_BYTES of float64 copies, whatever T x G)."""
    loads_TG = np.asarray(loads_TG)
    if loads_TG.ndim != 2 or loads_TG.shape[0] == 0:
        raise ValueError(f"loads must be [steps, GPUs] with at least one step, got shape {loads_TG.shape}")
    steps, gpus = loads_TG.shape
    max_G, mean_G, p99_G = (np.empty(gpus, dtype=np.float64) for _ in range(3))
    per = max(1, STATS_CHUNK_BYTES // (8 * steps))
    for start in range(0, gpus, per):
        block_TG = np.asarray(loads_TG[:, start:start + per], dtype=np.float64)
        max_G[start:start + per] = block_TG.max(axis=0)
        mean_G[start:start + per] = block_TG.mean(axis=0)
        p99_G[start:start + per] = np.percentile(block_TG, 99.0, axis=0)
    return GpuWindowStats(max_G=max_G, mean_G=mean_G, p99_G=p99_G)


@dataclass(frozen=True)
class StepVsWindow:
    """Per-step imbalance beside window-sum imbalance, per layer.

    per_step_TL: max/mean of each step's loads; window_sum_L: max/mean of the loads summed over the window;
    per_step_mean_L / per_step_p99_L: mean and p99 over the steps of per_step_TL (NaN steps ignored)."""

    per_step_TL: np.ndarray
    window_sum_L: np.ndarray
    per_step_mean_L: np.ndarray
    per_step_p99_L: np.ndarray


def step_vs_window(loads_TLG: np.ndarray) -> StepVsWindow:
    """Imbalance of every single step vs imbalance of the window sum. A window sum averages out the
    per-step tail: window_sum_L <= per-step imbalance of the worst step, often far below it."""
    loads_TLG = np.asarray(loads_TLG)
    if loads_TLG.dtype != np.float32:  # float32 loads (the step window's) are read as they are: no float64 copy
        loads_TLG = loads_TLG.astype(np.float64)
    if loads_TLG.ndim != 3 or loads_TLG.shape[0] == 0:
        raise ValueError(f"loads must be [steps, layers, GPUs] with at least one step, got {loads_TLG.shape}")
    per_step_TL = imbalance(loads_TLG)
    window_sum_L = imbalance(loads_TLG.sum(axis=0, dtype=np.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN layers stay NaN
        mean_L = np.nanmean(per_step_TL, axis=0)
        p99_L = np.nanpercentile(per_step_TL, 99.0, axis=0)
    return StepVsWindow(per_step_TL=per_step_TL, window_sum_L=window_sum_L, per_step_mean_L=mean_L,
                        per_step_p99_L=p99_L)


@dataclass(frozen=True)
class Straggler:
    """The GPU that holds the window back, how far above the all-GPU mean its load runs (ratio) and the
    share of `basis` (steps, or (step, layer) pairs) in which it was the busiest GPU."""

    gpu: int
    ratio_to_mean: float
    busiest_share: float
    basis: str = "steps"


def straggler(loads_TG: np.ndarray) -> Straggler | None:
    """The straggler of a window of per-step GPU loads [T, G]; None when there is no load at all."""
    loads_TG = np.asarray(loads_TG, dtype=np.float64)
    if loads_TG.ndim != 2 or loads_TG.shape[0] == 0:
        raise ValueError(f"loads must be [steps, GPUs] with at least one step, got shape {loads_TG.shape}")
    mean_G = loads_TG.mean(axis=0)
    if mean_G.max() <= 0:
        return None
    gpu = int(np.argmax(mean_G))
    busy_T = loads_TG.max(axis=1) > 0
    busiest_share = float((np.argmax(loads_TG[busy_T], axis=1) == gpu).mean()) if busy_T.any() else 0.0
    return Straggler(gpu=gpu, ratio_to_mean=float(mean_G[gpu] / mean_G.mean()), busiest_share=busiest_share)


def layer_straggler(loads_TLG: np.ndarray) -> Straggler | None:
    """The straggler judged per layer: a layer finishes when its own busiest GPU finishes, so the straggler
    is the GPU that is busiest in the most (step, layer) pairs with any load (ties: the lower GPU id);
    busiest_share is that share of pairs, ratio_to_mean its mean load over all (step, layer) pairs over the
    mean of all GPUs. Summing layers first would let different hot GPUs in different layers cancel.
    None when there is no load at all."""
    loads_TLG = np.asarray(loads_TLG)
    if loads_TLG.dtype.kind != "f":  # float32 loads stay float32: max and argmax are exact, sums in float64
        loads_TLG = loads_TLG.astype(np.float64)
    if loads_TLG.ndim != 3 or loads_TLG.shape[0] == 0:
        raise ValueError(f"loads must be [steps, layers, GPUs] with at least one step, got {loads_TLG.shape}")
    busiest_TL, busy_TL = busiest_per_layer(loads_TLG)
    return layer_straggler_of(busiest_TL, busy_TL, loads_TLG.sum(axis=1, dtype=np.float64), loads_TLG.shape[1])


def busiest_per_layer(loads_TLG: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(busiest_TL int64 [T, L]: the GPU each (step, layer) waits for, the lowest id on ties; busy_TL bool
    [T, L]: that pair has any load) of GPU loads [T, L, G]."""
    loads_TLG = np.asarray(loads_TLG)
    busiest_TL = np.argmax(loads_TLG, axis=2)
    busy_TL = np.take_along_axis(loads_TLG, busiest_TL[..., None], axis=2)[..., 0] > 0
    return busiest_TL, busy_TL


def layer_straggler_of(busiest_TL: np.ndarray, busy_TL: np.ndarray, layer_sum_TG: np.ndarray,
                       num_layers: int) -> Straggler | None:
    """layer_straggler() from its parts (a step window keeps them per row): busiest_TL / busy_TL as
    busiest_per_layer() gives them, layer_sum_TG float [T, G] each GPU's load summed over the num_layers layers
    of each step."""
    busiest_X, busy_X = np.asarray(busiest_TL).ravel(), np.asarray(busy_TL).ravel()
    if not busy_X.any():
        return None
    layer_sum_TG = np.asarray(layer_sum_TG, dtype=np.float64)
    wins_G = np.bincount(busiest_X[busy_X], minlength=layer_sum_TG.shape[1])
    gpu = int(np.argmax(wins_G))
    mean_G = layer_sum_TG.sum(axis=0) / (layer_sum_TG.shape[0] * num_layers)
    return Straggler(gpu=gpu, ratio_to_mean=float(mean_G[gpu] / mean_G.mean()),
                     busiest_share=float(wins_G[gpu] / busy_X.sum()), basis="(step, layer) pairs")


def worst_layer(eta_TL: np.ndarray) -> int:
    """The layer with the lowest mean per-step balancedness over the window (eta [T, L], NaN: idle); 0 when
    every layer is idle."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # layers idle in every step stay NaN
        eta_L = np.nanmean(np.asarray(eta_TL, dtype=np.float64), axis=0)
    return int(np.nanargmin(eta_L)) if np.isfinite(eta_L).any() else 0

"""Measured vs estimated: what an engine's balancer actually won (pure numpy, no Streamlit), for the GPU panel.

Per step, the busiest GPU over the mean GPU (imbalance, 1 = even) twice: under the even-split estimate of the
step's logical counts and the layout in force (core.dispatch.DispatchModel(..., "even")), and under the loads
the engine measured (its physical records, core.measured_gpu_loads). won = estimated - measured (> 0: the
balancer beat the even split). Loads of one layer (layer=L), every layer summed (summed=True), or by default
each layer's own imbalance averaged over the layers that served tokens.

Shape legend: T steps, L layers, E logical experts, P physical slots, G GPUs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from moe_monitor.core.dispatch import DispatchModel


@dataclass(frozen=True)
class MeasuredVsEstimated:
    """Per step (step_T int64 [T], the steps both sides have): estimated_T and measured_T float64 [T] busiest GPU
    over mean GPU (NaN: no tokens), won_T = estimated_T - measured_T; coverage_T float64 [T] measured tokens over
    estimated tokens (1 when the physical records hold every token of the step's logical counts)."""

    step_T: np.ndarray
    estimated_T: np.ndarray
    measured_T: np.ndarray
    won_T: np.ndarray
    coverage_T: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.step_T.size)

    def mean(self, values_T: np.ndarray) -> float:
        """The mean over steps of one of the [T] series, NaN steps left out (NaN when none)."""
        finite = values_T[np.isfinite(values_T)]
        return float(finite.mean()) if finite.size else float("nan")


def even_estimate(counts_TLE, layout_LP, num_experts: int, gpus: int) -> np.ndarray:
    """float64 [T, L, G]: GPU loads of steps counts [T, L, E] under layout_LP [L, P] with each expert's tokens
    split evenly over its replicas (core.dispatch's "even" policy)."""
    return DispatchModel(layout_LP, num_experts, gpus, "even").gpu_loads(counts_TLE)


def imbalance(loads_TLG, layer: int | None = None, summed: bool = False) -> np.ndarray:
    """float64 [T]: busiest GPU over mean GPU of each step's loads [T, L, G] (see the module docstring for
    layer and summed); NaN for a step without tokens."""
    loads = np.asarray(loads_TLG, dtype=np.float64)
    if loads.ndim != 3:
        raise ValueError(f"loads must be [steps, layers, gpus], got shape {loads.shape}")
    if layer is not None:
        if not 0 <= layer < loads.shape[1]:
            raise ValueError(f"layer {layer} is outside 0..{loads.shape[1] - 1}")
        loads = loads[:, layer:layer + 1]
    elif summed:
        loads = loads.sum(axis=1, keepdims=True)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # a step whose layers all idle: NaN
        mean_TL = loads.mean(axis=2)
        ratio_TL = np.where(mean_TL > 0, loads.max(axis=2) / mean_TL, np.nan)
        return np.nanmean(ratio_TL, axis=1)


def compare(estimated_TLG, estimated_step_T, measured_TLG, measured_step_T, layer: int | None = None,
            summed: bool = False) -> MeasuredVsEstimated:
    """The steps both sides have (matched by step id, in estimated_step_T's order): estimated loads [T, L, G]
    of steps estimated_step_T [T], measured loads [T', L, G] of steps measured_step_T [T']. ValueError when the
    two disagree on layers or GPUs, or a side's step ids do not match its loads."""
    est = np.asarray(estimated_TLG, dtype=np.float64)
    meas = np.asarray(measured_TLG, dtype=np.float64)
    est_T, meas_T = np.asarray(estimated_step_T, dtype=np.int64), np.asarray(measured_step_T, dtype=np.int64)
    if est.ndim != 3 or meas.ndim != 3 or est.shape[0] != est_T.size or meas.shape[0] != meas_T.size:
        raise ValueError(f"loads [steps, layers, gpus] with one step id per step: estimated {est.shape} for "
                         f"{est_T.size} steps, measured {meas.shape} for {meas_T.size} steps")
    if est.shape[1:] != meas.shape[1:]:
        raise ValueError(f"the estimate is [{est.shape[1]} layers, {est.shape[2]} GPUs], the measured loads "
                         f"[{meas.shape[1]}, {meas.shape[2]}]")
    row_of = {int(step): i for i, step in enumerate(meas_T)}
    pairs = [(i, row_of[int(step)]) for i, step in enumerate(est_T) if int(step) in row_of]
    est_rows = np.array([i for i, _ in pairs], dtype=np.int64)
    meas_rows = np.array([j for _, j in pairs], dtype=np.int64)
    est, meas = est[est_rows], meas[meas_rows]
    estimated, measured = imbalance(est, layer, summed), imbalance(meas, layer, summed)
    est_tokens_T, meas_tokens_T = est.sum(axis=(1, 2)), meas.sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        coverage = np.where(est_tokens_T > 0, meas_tokens_T / np.where(est_tokens_T > 0, est_tokens_T, 1.0), np.nan)
    return MeasuredVsEstimated(step_T=est_T[est_rows], estimated_T=estimated, measured_T=measured,
                               won_T=estimated - measured, coverage_T=coverage)

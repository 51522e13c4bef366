"""What-if numbers, pure (no Streamlit): pick the fit and score windows from the watched steps (with the
sampled routing rows of the score window, for dashboard.whatif.traffic) and score a layout on the score window.

Fit window: up to planner.windows.MAX_WINDOWS windows of summed steps [W, L, E] (oldest first), before the score
window when held out; score window: the `score_steps` newest steps. Even-split GPU loads; eta as the Overview's
(idle (step, layer) pairs NaN, left out of every mean). Docs: docs/dashboard.md, "What-if".

Shape legend (README, Conventions): T steps, W windows of summed steps, L layers, E logical experts, P slots,
G GPUs, N sampled tokens, K top-k.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from moe_monitor.core.costmodel import Verdict
from moe_monitor.core.loadmodel import balancedness, gpu_weights, weighted_loads
from moe_monitor.dashboard.analytics.balance import LayerSpread, across_layers
from moe_monitor.dashboard.live.samples import SampledRows
from moe_monitor.planner.timecost import time_verdict
from moe_monitor.planner.windows import split_windows

MAX_SAMPLE_ROWS = 4096


@dataclass(frozen=True)
class WhatIfData:
    """A frozen copy of the inputs (the page re-plans only when this changes).

    fit_WLE float64 fit windows; score_TLE int64 per-step counts of the score window; score_tokens_T its
    tokens per step; samples: sampled rows of the score window with their source ranks (None when the
    collector sends none); fit_steps / fit_span_s: steps and seconds covered by the fit window; as_of_step:
    the newest step; overlap: the fit window ends with the newest step, so it covers the score window (hold-out
    off, or too few steps to hold out)."""

    fit_WLE: np.ndarray
    score_TLE: np.ndarray
    score_tokens_T: np.ndarray
    samples: SampledRows | None
    fit_steps: int
    fit_span_s: float
    as_of_step: int
    overlap: bool

    @property
    def num_layers(self) -> int:
        return self.score_TLE.shape[1]

    @property
    def num_experts(self) -> int:
        return self.score_TLE.shape[2]

    @property
    def score_sum_LE(self) -> np.ndarray:
        return self.score_TLE.sum(0)


def fit_and_score_steps(time_s_T: ArrayLike, score_steps: int, fit: float, unit: str = "steps",
                        hold_out: bool = True) -> tuple[np.ndarray, np.ndarray, bool]:
    """Indices (into steps oldest..newest) of the fit and score windows, and whether they overlap.

    unit 'steps': fit = that many steps; 'minutes': the steps within `fit` minutes of the fit window's
    newest step. Held out, the fit window ends just before the score window; when that leaves no step the
    fit window falls back to ending with the newest step (overlap True)."""
    t = np.asarray(time_s_T, dtype=np.float64)
    n = t.size
    if n == 0:
        raise ValueError("no steps to fit on")
    if score_steps < 1 or fit <= 0:
        raise ValueError(f"score window and fit window must be positive, got {score_steps} and {fit}")
    if unit not in ("steps", "minutes"):
        raise ValueError(f"fit window unit must be 'steps' or 'minutes', got {unit!r}")
    score_idx = np.arange(max(0, n - score_steps), n)
    end = score_idx[0] if hold_out and score_idx[0] > 0 else n
    if unit == "steps":
        start = max(0, end - int(fit))
    else:
        start = int(np.searchsorted(t[:end], t[end - 1] - fit * 60.0, side="left"))
    return np.arange(start, end), score_idx, bool(end == n)


def fit_and_score_windows(counts_TLE: ArrayLike, step_T: ArrayLike, time_s_T: ArrayLike, tokens_T: ArrayLike,
                          samples_of: Callable[[np.ndarray], SampledRows | None], score_steps: int, fit: float,
                          unit: str = "steps", hold_out: bool = True) -> WhatIfData:
    """The frozen fit and score windows of the watched steps (oldest first; see fit_and_score_steps).
    samples_of(steps) -> SampledRows | None (SampleRing.sampled) gives the sampled rows of some steps; the
    newest MAX_SAMPLE_ROWS rows of the score window are kept."""
    fit_idx, score_idx, overlap = fit_and_score_steps(time_s_T, score_steps, fit, unit, hold_out)
    c = np.asarray(counts_TLE)
    t = np.asarray(time_s_T, dtype=np.float64)
    samples = samples_of(np.asarray(step_T)[score_idx])
    if samples is not None:
        samples = samples.tail(MAX_SAMPLE_ROWS)
    return WhatIfData(fit_WLE=split_windows(c[fit_idx]), score_TLE=c[score_idx].astype(np.int64),
                      score_tokens_T=np.asarray(tokens_T, dtype=np.int64)[score_idx], samples=samples,
                      fit_steps=int(fit_idx.size), fit_span_s=float(t[fit_idx[-1]] - t[fit_idx[0]]),
                      as_of_step=int(np.asarray(step_T)[-1]), overlap=overlap)


@dataclass(frozen=True)
class Score:
    """A layout on the score window, with the Overview's rule (dashboard.analytics): eta = mean/max GPU
    load, NaN for a (step, layer) or layer without tokens, and every mean is NaN-safe, so idle pairs drop
    out instead of counting as perfectly balanced. eta_sum_L: eta of window-summed loads per layer;
    eta_step_TL: per step; mean_load_LG: mean per-step GPU load; active_L: layers with tokens."""

    eta_sum_L: np.ndarray
    eta_step_TL: np.ndarray
    mean_load_LG: np.ndarray
    active_L: np.ndarray

    @property
    def imbalance_sum_L(self) -> np.ndarray:
        """max/mean of window-summed loads per layer [L]; NaN for idle layers."""
        return 1.0 / self.eta_sum_L

    def mean_over_active_layers(self, values_L: ArrayLike) -> float:
        """Mean over active layers (all layers when none is active) of a per-layer value, NaN-safe."""
        a = self.active_L if self.active_L.any() else np.ones_like(self.active_L)
        return _nanmean(np.asarray(values_L, dtype=np.float64)[a])

    @property
    def balancedness(self) -> float:
        """Mean over active layers of the window-sum balancedness (mean/max)."""
        return _nanmean(self.eta_sum_L)

    @property
    def step_balancedness(self) -> float:
        """Mean of per-step eta over the (step, layer) pairs that had tokens = 1 - the Overview's idle share."""
        return _nanmean(self.eta_step_TL)

    @property
    def step_spread(self) -> LayerSpread:
        """min / p50 / p90 across layers of each layer's mean per-step eta (the Overview's 'window
        per-step mean')."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # layers idle in every step stay NaN
            return across_layers(np.nanmean(self.eta_step_TL, axis=0))

    @property
    def sum_spread(self) -> LayerSpread:
        """min / p50 / p90 across layers of the window-sum eta (the Overview's 'window sum')."""
        return across_layers(self.eta_sum_L)

    @property
    def worst_imbalance(self) -> float:
        return float(np.nanmax(self.imbalance_sum_L)) if self.active_L.any() else 1.0


def _nanmean(values: ArrayLike) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def score(layout_LP: ArrayLike, score_TLE: ArrayLike, gpus: int) -> Score:
    """Score a layout [L, P] on per-step counts [T, L, E] (loads by the same code as the Overview's)."""
    c = np.asarray(score_TLE)
    loads_TLG = weighted_loads(c, gpu_weights(layout_LP, c.shape[2], gpus))
    return Score(eta_sum_L=balancedness(loads_TLG.sum(0, dtype=np.float64)),
                 eta_step_TL=balancedness(loads_TLG), mean_load_LG=loads_TLG.mean(0, dtype=np.float64),
                 active_L=c.sum((0, 2)) > 0)


def in_time(before_LP: ArrayLike, after_LP: ArrayLike, score_TLE: ArrayLike, gpus: int, model, dispatch: str = "even"
            ) -> tuple[Verdict, Verdict]:
    """(current, what-if) core.costmodel verdicts of two layouts on the score window's per-step counts under the
    run's dispatch policy (planner.timecost.time_verdict: the same pricing as `moe-monitor score`)."""
    c = np.asarray(score_TLE, dtype=np.float64)
    return (time_verdict(c, np.asarray(before_LP), gpus, dispatch, model)[0],
            time_verdict(c, np.asarray(after_LP), gpus, dispatch, model)[0])


def time_line(before: Verdict, after: Verdict, label: str) -> str:
    """One sentence: the MoE layers' predicted time per step and the wait for the busiest GPU, now and with the
    what-if layout."""
    change = after.moe_s / before.moe_s - 1.0 if before.moe_s > 0 else 0.0
    return (f"In time (predicted for {label}): the MoE layers take {before.moe_s * 1e3:.3f} ms per step with the "
            f"current layout, {after.moe_s * 1e3:.3f} ms with this one ({change:+.1%}); the wait for the busiest GPU "
            f"goes from {before.lost_s * 1e3:.3f} to {after.lost_s * 1e3:.3f} ms per step.")

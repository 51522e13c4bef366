"""Per-step statistics of rollup buckets: what a bucket's summed counts hide (pure numpy).

Balancedness of a bucket's summed counts reads near 1 while single steps sit well below it, so each bucket
(core.RollupRecord) carries a histogram of per-(step, layer) eta and the busiest GPU's load per step. These
functions turn them into per-bucket series and window totals: per-step eta quantiles (exact to the bin width),
the busiest GPU's mean and peak load per step, the mean per-step imbalance. `tail_q` (default 0.01) gives the
eta that 1% of (step, layer) pairs fall below, the per-step counterpart of a p99 imbalance.

Shape legend: T buckets, B histogram bins (core.ETA_BINS; bin b holds eta in [b / B, (b + 1) / B)).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TAIL_Q = 0.01


def eta_quantiles(hist_TB: np.ndarray, q: float) -> np.ndarray:
    """float64 [T]: the q-quantile (0..1) of each bucket's balancedness histogram [T, B], at the upper edge of
    the bin that holds it (core.eta_quantile for every row at once); NaN for an empty histogram."""
    hist_TB = np.asarray(hist_TB, dtype=np.int64)
    if hist_TB.ndim != 2 or hist_TB.shape[1] < 1:
        raise ValueError(f"histograms must be [buckets, bins], got shape {hist_TB.shape}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must lie in 0..1, got {q}")
    cum_TB = np.cumsum(hist_TB, axis=1)
    total_T = cum_TB[:, -1] if hist_TB.shape[0] else np.zeros(0, dtype=np.int64)
    target_T = np.maximum(q * total_T, 1.0)
    index_T = np.minimum((cum_TB < target_T[:, None]).sum(axis=1), hist_TB.shape[1] - 1)
    value_T = np.minimum(1.0, (index_T + 1) / hist_TB.shape[1])
    return np.where(total_T > 0, value_T, np.nan)


@dataclass(frozen=True)
class PerStepStats:
    """Per-step statistics of T rollup buckets and of the whole window.

    Per bucket [T]: eta_p50_T / eta_tail_T the median and the tail_q quantile of per-(step, layer) balancedness;
    busiest_mean_T the busiest GPU's tokens per step (layer mean, averaged over the bucket's steps), mean_load_T
    the mean GPU's; busiest_peak_T the busiest GPU's tokens in any layer of any step; imbalance_T the mean
    per-step imbalance (busiest over mean GPU load). NaN for a bucket without steps.
    Window: eta_p50 / eta_tail from the summed histograms; busiest_mean (over all steps) and busiest_peak;
    steps; missing_rank_steps / late_rank_steps summed."""

    eta_p50_T: np.ndarray
    eta_tail_T: np.ndarray
    busiest_mean_T: np.ndarray
    mean_load_T: np.ndarray
    busiest_peak_T: np.ndarray
    imbalance_T: np.ndarray
    eta_p50: float
    eta_tail: float
    busiest_mean: float
    busiest_peak: float
    steps: int
    missing_rank_steps: int
    late_rank_steps: int
    tail_q: float = TAIL_Q


def per_step_stats(eta_hist_TB: np.ndarray, steps_T: np.ndarray, max_load_sum_T: np.ndarray,
                   mean_load_sum_T: np.ndarray, max_load_peak_T: np.ndarray, missing_T: np.ndarray | None = None,
                   late_T: np.ndarray | None = None, tail_q: float = TAIL_Q) -> PerStepStats:
    """PerStepStats of T buckets: eta_hist_TB int [T, B] histograms; steps_T int [T]; max_load_sum_T /
    mean_load_sum_T float [T] the busiest / mean GPU's tokens (layer mean) summed over each bucket's steps;
    max_load_peak_T float [T]; missing_T / late_T int [T] rank-steps missing / folded in late (default 0)."""
    steps_T = np.asarray(steps_T, dtype=np.int64)
    count = steps_T.shape[0]
    arrays = [np.asarray(a, dtype=np.float64) for a in (max_load_sum_T, mean_load_sum_T, max_load_peak_T)]
    if steps_T.ndim != 1 or any(a.shape != (count,) for a in arrays) or np.shape(eta_hist_TB)[0] != count:
        raise ValueError("every per-bucket array must have one value per bucket")
    max_sum_T, mean_sum_T, peak_T = arrays
    per_step = np.where(steps_T > 0, steps_T, 1).astype(np.float64)
    empty = steps_T <= 0
    busiest_T = np.where(empty, np.nan, max_sum_T / per_step)
    mean_T = np.where(empty, np.nan, mean_sum_T / per_step)
    with np.errstate(divide="ignore", invalid="ignore"):
        imbalance_T = np.where(empty | (mean_sum_T <= 0), np.nan, max_sum_T / np.where(mean_sum_T > 0, mean_sum_T, 1))
    total_B = np.asarray(eta_hist_TB, dtype=np.int64).sum(axis=0, keepdims=True) if count else np.zeros((1, 1))
    steps = int(steps_T.sum())
    return PerStepStats(
        eta_p50_T=eta_quantiles(eta_hist_TB, 0.5), eta_tail_T=eta_quantiles(eta_hist_TB, tail_q),
        busiest_mean_T=busiest_T, mean_load_T=mean_T, busiest_peak_T=np.where(empty, np.nan, peak_T),
        imbalance_T=imbalance_T,
        eta_p50=float(eta_quantiles(total_B, 0.5)[0]), eta_tail=float(eta_quantiles(total_B, tail_q)[0]),
        busiest_mean=float(max_sum_T.sum() / steps) if steps else float("nan"),
        busiest_peak=float(peak_T[~empty].max()) if (~empty).any() else float("nan"), steps=steps,
        missing_rank_steps=int(np.asarray(missing_T if missing_T is not None else 0).sum()),
        late_rank_steps=int(np.asarray(late_T if late_T is not None else 0).sum()), tail_q=tail_q,
    )

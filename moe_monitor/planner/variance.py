"""Even out the GPUs' noise as well as their means: swaps that lower the busiest GPU's mean + z standard deviations.

A GPU's load is the sum over its slots of a per-replica share with mean mu_e / r_e and variance var_e / r_e**2
(experts independent; one expert once per GPU). Its high quantile is near mean_g + z sd_g; linearised around the
mean GPU variance v, that is mean_g + z var_g / (2 sqrt v) (docs/planner.md). Swaps keep replica counts, so each
slot carries a fixed weight mu_e / r_e + k var_e / r_e**2 and planner.refine minimises the largest GPU's sum.
The tail objective uses it for step-to-step noise (var_e: per-step share variance), the default's drift fit for
window-to-window drift (var_e: sigma**2 mu_e**2, sigma the drift seen between windows).

Shapes: layout_LP [L, P]; mean_LE, var_LE [L, E] (per layer, shares or any common unit).
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.loadmodel import replica_counts

from .refine import refine_swaps

Z_P99 = 3.0   # the busiest of G = 32 GPUs sits about this many standard deviations above the mean (p99)


def variance_swaps(layout_LP, mean_LE, var_LE, gpus: int, z: float = Z_P99) -> np.ndarray:
    """Layout [L, P] after swaps minimising max over GPUs of mean + z var / (2 sqrt v) (module docstring)."""
    lay = np.asarray(layout_LP, dtype=np.int64)
    mu, var = np.asarray(mean_LE, dtype=np.float64), np.asarray(var_LE, dtype=np.float64)
    E = mu.shape[1]
    rep = replica_counts(lay, E)
    v = (var / rep).sum(1) / gpus                                   # mean GPU variance [L]
    k = z / (2 * np.sqrt(np.where(v > 0, v, 1.0)))
    w_LE = mu / rep + k[:, None] * var / rep ** 2
    out, _, _ = refine_swaps(lay, np.take_along_axis(w_LE, lay, axis=1)[None], gpus, E)
    return out


def drift_sigma(shares_WLE: np.ndarray) -> np.ndarray:
    """Per layer, the median over consecutive windows of the root mean square of log(share_t+1 / share_t) over
    the experts seen in both, [L] (0 with one window). The median: a one-off shift is not drift."""
    if shares_WLE.shape[0] < 2:
        return np.zeros(shares_WLE.shape[1])
    a, b = shares_WLE[:-1], shares_WLE[1:]
    ok = (a > 0) & (b > 0)
    r = np.log(np.where(ok, b, 1.0) / np.where(ok, a, 1.0))
    return np.median(np.sqrt((r ** 2 * ok).sum(2) / np.maximum(ok.sum(2), 1)), axis=0)

"""The default's fit of windowed counts, chosen by a rolling-origin backtest: which view of the past predicted
the next window.

Candidates: "newest" (the last window, its GPUs' drift noise evened out), "robust" (all windows), "recent" (old
windows faded fast). ``backtest`` fits each on the windows before k and scores it on k, for the last MAX_FOLDS
windows; ``choose`` keeps "newest" unless a blend beats it by MARGIN, and falls back to "robust" when the folds
disagree. The rule, why, and its figures: docs/planner.md, "The default on windows".

Shapes: counts_WLE [W, L, E] windows oldest..newest; layout_LP [L, E + R]; scores [N folds, L'].
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .loads import layer_imbalance
from .robust import fit_robust, normalise
from .variance import drift_sigma, variance_swaps

Fit = Callable[[np.ndarray, int, int], np.ndarray]
MAX_FOLDS = 4         # folds of the rolling-origin backtest (the newest windows, each scored once)
BACKTEST_LAYERS = 16  # layers the folds fit and score (evenly spaced; layers are fitted independently)
MARGIN = 0.01         # mean max/mean a blend must gain over the newest-window fit in the folds
AGREE = 0.75          # share of folds on which "recent" must beat the robust fit


def _robust(decay: float, recent: int) -> Fit:
    return lambda c, gpus, redundant: fit_robust(c, gpus, redundant, decay=decay, recent=recent)


def fit_newest(counts_WLE: np.ndarray, gpus: int, redundant: int) -> np.ndarray:
    """The robust fit on the newest window alone, then swaps that even out the GPUs' spread under the drift
    seen between the windows (share_e moves by a factor exp(N(0, sigma**2)): variance sigma**2 share_e**2)."""
    lay = fit_robust(counts_WLE[-1:], gpus, redundant, recent=1)
    if counts_WLE.shape[0] < 2:
        return lay
    shares = normalise(counts_WLE)
    sigma = drift_sigma(shares)
    return variance_swaps(lay, shares[-1], sigma[:, None] ** 2 * shares[-1] ** 2, gpus)


def candidates(decay: float, recent: int) -> dict[str, Fit]:
    """The fits the backtest picks among (module docstring)."""
    return {"newest": fit_newest, "robust": _robust(decay, recent),
            "recent": _robust(min(decay, 0.5), min(recent, 2))}


def backtest(counts_WLE: np.ndarray, gpus: int, redundant: int, fits: dict[str, Fit],
             folds: int = MAX_FOLDS) -> dict[str, np.ndarray]:
    """Per candidate, [N, L'] per-layer imbalance on window k of the fit on windows < k, for the last
    N = min(folds, W - 1) windows k (oldest fold first), on L' <= BACKTEST_LAYERS evenly spaced layers."""
    W, L = counts_WLE.shape[:2]
    ks = range(max(1, W - folds), W)
    c = counts_WLE[:, np.unique(np.linspace(0, L - 1, min(L, BACKTEST_LAYERS)).round().astype(int))]
    return {name: np.stack([layer_imbalance(c[k], fit(c[:k], gpus, redundant), gpus) for k in ks])
            for name, fit in fits.items()}


def choose(scores: dict[str, np.ndarray], margin: float = MARGIN, agree: float = AGREE) -> str:
    """The candidate to refit from the backtest's scores (module docstring)."""
    fold = {n: s.mean(1) for n, s in scores.items()}                  # [N] per candidate
    mean = {n: float(f.mean()) for n, f in fold.items()}
    blend = min(("robust", "recent"), key=lambda n: mean[n])            # ties: the robust fit
    if blend == "recent" and (fold["recent"] < fold["robust"]).mean() < agree:
        blend = "robust"
    return blend if mean[blend] < mean["newest"] - margin else "newest"


def fit_heldin(counts_WLE, gpus: int, redundant: int, decay: float = 1.0, recent: int = 16,
               folds: int = MAX_FOLDS) -> tuple[np.ndarray, str]:
    """(layout [L, E + R], the name of the chosen fit) by the rolling-origin backtest (module docstring)."""
    c = np.asarray(counts_WLE, dtype=np.float64)
    fits = candidates(decay, recent)
    if c.shape[0] < 2:
        return fits["robust"](c, gpus, redundant), "robust"
    best = choose(backtest(c, gpus, redundant, fits, folds))
    return fits[best](c, gpus, redundant), best

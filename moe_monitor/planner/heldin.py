"""Pick the robust fit's blend by a rolling-origin backtest: which view of the past predicted the next window.

Under drift the newest window predicts the next one better than a blend of all of them (a random walk of
popularity); under stationary traffic, or windows of unrelated workloads, the blend hedges better. ``fit_heldin``
backtests each candidate fit (``candidates``) on up to ``MAX_FOLDS`` folds: fit on the windows before k, score on
window k (mean over layers of max/mean GPU load), for the last folds k. A candidate other than the robust fit is
taken only when it has the lowest mean over the folds AND beats the robust fit on at least ``AGREE`` of them;
when the folds disagree, the robust fit (the fallback) is refitted on all windows. One window: the robust fit.

Shapes: counts_WLE [W, L, E] windows oldest..newest; layout_LP [L, E + R]; scores [N folds] or [N, L].
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .loads import layer_imbalance
from .robust import fit_robust

Fit = Callable[[np.ndarray, int, int], np.ndarray]
MAX_FOLDS = 4        # folds of the rolling-origin backtest (the newest windows, each scored once)
AGREE = 0.75         # share of folds on which a challenger must beat the robust fit


def _robust(decay: float, recent: int) -> Fit:
    return lambda c, gpus, redundant: fit_robust(c, gpus, redundant, decay=decay, recent=recent)


def _newest(c: np.ndarray, gpus: int, redundant: int) -> np.ndarray:
    """The robust fit on the newest window alone (its one scenario plus itself as the blend)."""
    return fit_robust(c[-1:], gpus, redundant, recent=1)


def candidates(decay: float, recent: int) -> dict[str, Fit]:
    """The fits the backtest picks among, the fallback first: the robust fit as asked, one that fades old
    windows fast, and the newest window alone."""
    return {"robust": _robust(decay, recent), "recent": _robust(min(decay, 0.5), min(recent, 2)),
            "newest": _newest}


def backtest(counts_WLE: np.ndarray, gpus: int, redundant: int, fits: dict[str, Fit],
             folds: int = MAX_FOLDS) -> dict[str, np.ndarray]:
    """Per candidate, [N, L] per-layer imbalance on window k of the fit on windows < k, for the last
    N = min(folds, W - 1) windows k (oldest fold first)."""
    W = counts_WLE.shape[0]
    ks = range(max(1, W - folds), W)
    return {name: np.stack([layer_imbalance(counts_WLE[k], fit(counts_WLE[:k], gpus, redundant), gpus)
                            for k in ks]) for name, fit in fits.items()}


def choose(scores: dict[str, np.ndarray], agree: float = AGREE) -> str:
    """The candidate to refit: the lowest mean over folds, unless it beats the first (fallback) candidate
    on fewer than ``agree`` of the folds (scores [N] or [N, L]: layers are averaged)."""
    per_fold = {n: s.mean(1) if s.ndim == 2 else s for n, s in scores.items()}
    fallback = next(iter(per_fold))
    best = min(per_fold, key=lambda n: float(per_fold[n].mean()))       # ties: the fallback (first)
    if best == fallback:
        return best
    wins = float((per_fold[best] < per_fold[fallback]).mean())
    return best if wins >= agree and per_fold[best].mean() < per_fold[fallback].mean() else fallback


def fit_heldin(counts_WLE, gpus: int, redundant: int, decay: float = 1.0, recent: int = 16,
               folds: int = MAX_FOLDS) -> tuple[np.ndarray, str]:
    """(layout [L, E + R], the name of the chosen fit) by the rolling-origin backtest (module docstring)."""
    c = np.asarray(counts_WLE, dtype=np.float64)
    fits = candidates(decay, recent)
    if c.shape[0] < 2:
        return fits["robust"](c, gpus, redundant), "robust"
    best = choose(backtest(c, gpus, redundant, fits, folds))
    return fits[best](c, gpus, redundant), best

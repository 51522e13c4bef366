"""Pick the robust fit's blend on held-in data: which view of the past predicts the next window best.

Under drift the newest window predicts the next one better than a blend of all of them (a random walk of
popularity: the next window is the last one moved by noise); under stationary traffic the blend of many windows
hedges better. Rather than guess, ``fit_heldin`` backtests: each candidate fit (``CANDIDATES``) is fitted on the
windows before the newest and scored on the newest one (mean over layers of max/mean GPU load, per layer when
``per_layer``), and the winner is then refitted on all windows. With a single window there is nothing to hold in
and the robust fit is returned.

Shapes: counts_WLE [W, L, E] windows oldest..newest; layout_LP [L, E + R].
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .loads import layer_imbalance
from .robust import fit_robust

Fit = Callable[[np.ndarray, int, int], np.ndarray]


def _robust(decay: float, recent: int) -> Fit:
    return lambda c, gpus, redundant: fit_robust(c, gpus, redundant, decay=decay, recent=recent)


def _newest(c: np.ndarray, gpus: int, redundant: int) -> np.ndarray:
    """The robust fit on the newest window alone (its one scenario plus itself as the blend)."""
    return fit_robust(c[-1:], gpus, redundant, recent=1)


def candidates(decay: float, recent: int) -> dict[str, Fit]:
    """The fits the backtest picks among: the robust fit as asked, one that fades old windows fast, and the
    newest window alone."""
    return {"robust": _robust(decay, recent), "recent": _robust(min(decay, 0.5), min(recent, 2)),
            "newest": _newest}


def heldin_scores(counts_WLE: np.ndarray, gpus: int, redundant: int, fits: dict[str, Fit]) -> dict[str, np.ndarray]:
    """Per candidate, the per-layer imbalance [L] on the newest window of the fit on the windows before it."""
    past, newest = counts_WLE[:-1], counts_WLE[-1]
    return {name: layer_imbalance(newest, fit(past, gpus, redundant), gpus) for name, fit in fits.items()}


def fit_heldin(counts_WLE, gpus: int, redundant: int, decay: float = 1.0, recent: int = 16,
               per_layer: bool = False) -> tuple[np.ndarray, str]:
    """(layout [L, E + R], the name of the chosen fit, or "per-layer" when layers chose apart)."""
    c = np.asarray(counts_WLE, dtype=np.float64)
    fits = candidates(decay, recent)
    if c.shape[0] < 2:
        return fits["robust"](c, gpus, redundant), "robust"
    scores = heldin_scores(c, gpus, redundant, fits)
    names = list(fits)
    if not per_layer:
        best = min(names, key=lambda n: float(scores[n].mean()))     # ties: the robust fit (first)
        return fits[best](c, gpus, redundant), best
    pick_L = np.argmin(np.stack([scores[n] for n in names]), axis=0)
    layouts = {n: fits[n](c, gpus, redundant) for n in names if (pick_L == names.index(n)).any()}
    out = np.stack([layouts[names[k]][layer] for layer, k in enumerate(pick_L)])
    return out, names[pick_L[0]] if (pick_L == pick_L[0]).all() else "per-layer"

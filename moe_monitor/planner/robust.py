"""Robust fitting for traffic that comes next: one layout that stays balanced on several windows.

Each window is normalised per layer (every window weighs the same), then: replicas go to experts by their
largest share over the windows (hot in any window => replicated); packing puts the heaviest replica first on
the GPU whose worst window stays lowest; refinement (swaps + replica moves) minimises the max over windows of
each window's busiest GPU. With ``decay`` < 1 older windows fade and only the ``recent`` newest are scenarios,
which follows drifting traffic.

Shapes: counts_WLE [W, L, E] (W windows); layout_LP [L, P].
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.counts import as_counts
from moe_monitor.core.loadmodel import slot_weights

from .loads import check_shape
from .pack import expand_replicas, layout_from_bins, replicate_greedy
from .refine import refine_swaps
from .replicas import refine_all


def normalise(counts_WLE: np.ndarray) -> np.ndarray:
    """Per-window, per-layer share of tokens [W, L, E] (rows without traffic stay zero)."""
    s = counts_WLE.sum(-1, keepdims=True)
    return counts_WLE / np.where(s > 0, s, 1.0)


def window_weights(num_windows: int, decay: float) -> np.ndarray:
    """Weights [W] of windows oldest..newest: decay ** age, summing to 1 (decay=1: equal)."""
    try:
        ok = 0.0 < decay <= 1.0
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"decay must be in (0, 1], got {decay!r}")
    w = decay ** np.arange(num_windows - 1, -1, -1, dtype=np.float64)
    return w / w.sum()


def check_recent(recent) -> int:
    """ValueError unless ``recent`` (the newest windows balanced at once) is a whole number >= 1."""
    if isinstance(recent, (bool, np.bool_)) or not isinstance(recent, (int, np.integer)) or recent < 1:
        raise ValueError(f"--recent (windows balanced at once) must be a whole number >= 1, got {recent!r}")
    return int(recent)


def scenarios(counts_WLE, decay: float = 1.0, recent: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """(blend_LE, scenarios_WLE): the decay-weighted blend of normalised windows and the scenario set
    (the ``recent`` newest normalised windows plus the blend), each normalised per layer."""
    recent = check_recent(recent)
    c = as_counts(counts_WLE, "counts", ndim=(3,))
    n = normalise(c)
    blend = np.einsum("t,tle->le", window_weights(c.shape[0], decay), n)
    scen = np.concatenate([n[-recent:], blend[None]], axis=0)
    return blend, scen


def vector_pack(w_WLI: np.ndarray, ids_LI: np.ndarray, bins: int) -> np.ndarray:
    """Bin [L, I] of each item, I // bins per bin: items by mean weight, heaviest first, onto the bin whose
    worst window after adding the item is lowest; never two items with the same id in one bin when
    avoidable."""
    W, L, I = w_WLI.shape
    cap = I // bins
    order = np.argsort(-w_WLI.mean(0), axis=1, kind="stable")
    rows = np.arange(L)
    bin_LI = np.empty((L, I), dtype=np.int64)
    load = np.zeros((W, L, bins))
    used = np.zeros((L, bins), dtype=np.int64)
    has = np.zeros((L, bins, int(ids_LI.max()) + 1), dtype=bool)
    for j in range(I):
        it = order[:, j]
        wt = w_WLI[:, rows, it]
        e = ids_LI[rows, it]
        key = (load + wt[:, :, None]).max(0)
        room = used < cap
        free = room & ~has[rows, :, e]
        key = np.where(np.where(free.any(1)[:, None], free, room), key, np.inf)
        b = key.argmin(1)
        bin_LI[rows, it] = b
        load[:, rows, b] += wt
        used[rows, b] += 1
        has[rows, b, e] = True
    return bin_LI


def fit_robust(counts_WLE, gpus: int, redundant: int, decay: float = 1.0, recent: int = 16,
               refine: bool = True, power: float = 8.0, smooth_iter: int = 60) -> np.ndarray:
    """Layout [L, E + R] for the traffic after ``counts_WLE`` (windows oldest..newest).

    Refinement: minimax over the scenarios, then up to ``smooth_iter`` swaps that lower the sum over
    scenarios of (GPU load / mean)**``power`` (improves the runner-up windows), then minimax again."""
    blend, scen = scenarios(counts_WLE, decay, recent)
    L, E = blend.shape
    check_shape(E, gpus, redundant)
    rep = replicate_greedy(scen.max(0), E + redundant, max_replicas=gpus)
    phys = expand_replicas(rep)
    w = np.take_along_axis(scen / rep, np.broadcast_to(phys, scen.shape[:1] + phys.shape), axis=2)
    lay = layout_from_bins(phys, vector_pack(w, phys, gpus), gpus)
    if refine:
        lay, _ = refine_all(lay, scen, gpus)
        if smooth_iter > 0:
            w = slot_weights(scen * (E + redundant) / gpus, lay)       # mean GPU load 1 per scenario
            lay, _, _ = refine_swaps(lay, w, gpus, E, power=power, max_iter=smooth_iter)
            lay, _ = refine_all(lay, scen, gpus)
    return lay

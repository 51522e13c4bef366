"""Pair re-splitting: pool two GPUs' 2S slot contents and split them again, S each, as evenly as possible
(exhaustively over the C(2S-1, S-1) splits, vectorised over layers and pairs). One move subsumes every k-k swap
between the two GPUs. Per layer, alternated until the busiest GPU stops improving (then seeded random kicks):
"hot" re-splits the busiest GPU with its ``partners`` lightest; "balance" re-splits disjoint pairs round-robin.

Shapes: layout_LP [L, P]; w_LP [L, P] per-slot load (count / replicas); target_L [L] the stop level (a lower
bound). A pair holding a replica of one expert on both GPUs is skipped; slot and replica counts never change.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import combinations
from math import comb

import numpy as np

MAX_SPLITS = 7000          # C(15, 7) = 6435: S <= 8 slots per GPU


def num_splits(slots: int) -> int:
    """C(2S-1, S-1), the number of splits one pair move enumerates."""
    return comb(2 * slots - 1, slots - 1)


@lru_cache(maxsize=8)
def split_masks(slots: int) -> np.ndarray:
    """All ways to keep ``slots`` of 2*``slots`` pooled items on the first GPU with item 0 kept there,
    float64 [J, 2S] of 0/1 (J = C(2S-1, S-1))."""
    n = 2 * slots
    idx = np.array([(0,) + c for c in combinations(range(1, n), slots - 1)], dtype=np.int64)
    m = np.zeros((idx.shape[0], n))
    np.put_along_axis(m, idx, 1.0, axis=1)
    m.flags.writeable = False
    return m


def round_robin(gpus: int) -> np.ndarray:
    """Pairs [rounds, gpus // 2, 2] such that every pair of GPUs meets once (circle method; odd G gets a
    bye each round)."""
    n = gpus + (gpus % 2)
    ids = list(range(n))
    out = []
    for _ in range(n - 1):
        rnd = [(ids[i], ids[n - 1 - i]) for i in range(n // 2)]
        out.append([p for p in rnd if max(p) < gpus])
        ids = [ids[0], ids[-1]] + ids[1:-1]
    return np.array(out, dtype=np.int64)


def _best_splits(lay, w, li, ga, gb, S, M):
    """For candidate moves (layer li, GPUs ga, gb), [n] each: the best split's index into M [n] and its
    larger load [n] (inf where the two GPUs share an expert). The first GPU's new load minus half the
    pair's total is w . (m - 1/2); the search runs in float32 on that, the winner is rescored in
    float64."""
    arS = np.arange(S)
    pos = np.concatenate([ga[:, None] * S + arS, gb[:, None] * S + arS], axis=1)    # [n, 2S]
    wp = w[li[:, None], pos]
    D = _centred(S)
    k = np.abs(wp.astype(np.float32) @ D.T).argmin(1)                               # [n]
    best = wp.sum(1) / 2 + np.abs((wp * (M[k] - 0.5)).sum(1))
    ids = lay[li[:, None], pos]
    shared = (ids[:, :S, None] == ids[:, None, S:]).any((1, 2))
    return k, np.where(shared, np.inf, best)


@lru_cache(maxsize=8)
def _centred(slots: int) -> np.ndarray:
    d = (split_masks(slots) - 0.5).astype(np.float32).T.copy().T
    d.flags.writeable = False
    return d


def _apply(lay, w, li, ga, gb, k, S, M):
    arS = np.arange(S)
    for l, a, b, kk in zip(li, ga, gb, k):
        m = M[kk] > 0
        pos = np.concatenate([a * S + arS, b * S + arS])
        ids, ws = lay[l, pos].copy(), w[l, pos].copy()
        lay[l, a * S + arS], w[l, a * S + arS] = ids[m], ws[m]
        lay[l, b * S + arS], w[l, b * S + arS] = ids[~m], ws[~m]


def hot_phase(lay, w, layers, gpus, S, M, target_L, partners, max_iter, tol, chunk):
    """Re-split the busiest GPU with its lightest partners until no move helps; in place. Returns the
    layers that are still above target."""
    active = layers
    for _ in range(max_iter):
        load = w[active].reshape(-1, gpus, S).sum(-1)
        active = active[load.max(1) > target_L[active] * (1 + tol)]
        if active.size == 0:
            break
        load = w[active].reshape(-1, gpus, S).sum(-1)
        A = active.size
        h = load.argmax(1)
        q = min(partners, gpus - 1)
        part = np.argsort(load, axis=1, kind="stable")[:, :q]                            # [A, q]
        li, ga, gb = np.repeat(active, q), np.repeat(h, q), part.ravel()
        ks, bs = [], []
        for lo in range(0, li.size, chunk):
            k, b = _best_splits(lay, w, li[lo:lo + chunk], ga[lo:lo + chunk], gb[lo:lo + chunk], S, M)
            ks.append(k)
            bs.append(b)
        k, b = np.concatenate(ks).reshape(A, q), np.concatenate(bs).reshape(A, q)
        j = b.argmin(1)
        ok = b[np.arange(A), j] < load[np.arange(A), h] * (1 - tol)
        if not ok.any():
            break
        sel = np.nonzero(ok)[0]
        _apply(lay, w, active[sel], h[sel], part[sel, j[sel]], k[sel, j[sel]], S, M)
        active = active[sel]
    load = w[layers].reshape(-1, gpus, S).sum(-1)
    return layers[load.max(1) > target_L[layers] * (1 + tol)]


def balance_sweep(lay, w, layers, gpus, S, M, tol, chunk):
    """One round-robin sweep (every GPU pair once) of re-splits that lower the pair's larger load; in
    place."""
    arS = np.arange(S)
    for rnd in round_robin(gpus):
        n = rnd.shape[0]
        li = np.repeat(layers, n)
        ga, gb = np.tile(rnd[:, 0], layers.size), np.tile(rnd[:, 1], layers.size)
        for lo in range(0, li.size, chunk):
            sl = slice(lo, lo + chunk)
            k, best = _best_splits(lay, w, li[sl], ga[sl], gb[sl], S, M)
            wa = w[li[sl][:, None], ga[sl][:, None] * S + arS].sum(1)
            wb = w[li[sl][:, None], gb[sl][:, None] * S + arS].sum(1)
            ok = best < np.maximum(wa, wb) * (1 - tol)
            _apply(lay, w, li[sl][ok], ga[sl][ok], gb[sl][ok], k[ok], S, M)


def _kick(lay, w, layers, gpus, S, kicks, rng):
    """Swap ``kicks`` random slot pairs on distinct GPUs per layer (never doubling an expert on a GPU);
    in place."""
    for l in layers:
        for _ in range(kicks):
            a, b = rng.choice(gpus, 2, replace=False)
            i, j = a * S + rng.integers(S), b * S + rng.integers(S)
            if lay[l, i] in lay[l, b * S:(b + 1) * S] or lay[l, j] in lay[l, a * S:(a + 1) * S]:
                continue
            lay[l, [i, j]] = lay[l, [j, i]]
            w[l, [i, j]] = w[l, [j, i]]


def _descend(lay, w, layers, gpus, S, M, tgt, partners, sweeps, max_iter, tol, chunk):
    """Hot phase, then balance sweep + hot phase while a sweep still lowers the max; in place."""
    left = hot_phase(lay, w, layers, gpus, S, M, tgt, partners, max_iter, tol, chunk)
    for _ in range(sweeps):
        if left.size == 0:
            break
        before = w[left].reshape(-1, gpus, S).sum(-1).max(1)
        balance_sweep(lay, w, left, gpus, S, M, tol, chunk)
        still = hot_phase(lay, w, left, gpus, S, M, tgt, partners, max_iter, tol, chunk)
        after = w[still].reshape(-1, gpus, S).sum(-1).max(1)
        keep = after < before[np.searchsorted(left, still)] * (1 - tol)     # stop where a sweep did nothing
        left = still[keep]


def refine_pairs(layout_LP, w_LP, gpus: int, target_L=None, partners: int = 8, sweeps: int = 12,
                 restarts: int = 30, kicks: int = 6, restart_gap: float = 4e-4, seed: int = 0, max_iter: int = 400, tol: float = 1e-9,
                 chunk_elems: int = 4_000_000):
    """Hot phase, then (for layers still above ``target_L``) balance sweeps + hot phase while they help;
    then, for layers still more than ``restart_gap`` above target, up to ``restarts`` perturbations (``kicks`` random swaps of the
    best layout so far, then the same descent), keeping each layer's best. Seeded: the same input gives
    the same layout. Returns (layout_LP, w_LP) as permuted copies; a layer's max GPU load never rises."""
    lay = np.array(layout_LP, dtype=np.int64)
    w = np.array(w_LP, dtype=np.float64)
    L, P = lay.shape
    S = P // gpus
    if num_splits(S) > MAX_SPLITS:
        raise ValueError(f"pair re-split enumerates C({2 * S - 1}, {S - 1}) splits; too many for S={S}")
    M = split_masks(S)
    chunk = max(1, chunk_elems // M.shape[0])
    tgt = np.zeros(L) if target_L is None else np.asarray(target_L, dtype=np.float64)
    _descend(lay, w, np.arange(L), gpus, S, M, tgt, partners, sweeps, max_iter, tol, chunk)
    rng = np.random.default_rng(seed)
    for _ in range(restarts if target_L is not None else 0):       # kicks only aim at a known bound
        peak = w.reshape(L, gpus, S).sum(-1).max(1)
        left = np.nonzero(peak > tgt * (1 + restart_gap))[0]
        if left.size == 0:
            break
        lay2, w2 = lay.copy(), w.copy()
        _kick(lay2, w2, left, gpus, S, kicks, rng)
        _descend(lay2, w2, left, gpus, S, M, tgt, partners, sweeps, max_iter, tol, chunk)
        better = left[w2[left].reshape(-1, gpus, S).sum(-1).max(1) < peak[left] * (1 - tol)]
        lay[better], w[better] = lay2[better], w2[better]
    return lay, w

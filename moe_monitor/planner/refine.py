"""Refinement after packing: swap two slots' contents between the hottest GPU and another GPU while that
lowers the hottest GPU's load, never putting two replicas of one expert on one GPU. Works on one
window or on several at once (minimising the max over windows of each window's GPU loads).

Shapes: layout_LP [L, P]; w_WLP [W, L, P] per-slot load (count / replicas, per window); pin_LP
optional [L, P] node a slot's content must stay on (-1 = free), carried with the content.
Replica counts never change here, so per-slot loads travel with their slot contents.
"""
from __future__ import annotations

import numpy as np


def _presence(layout_LP: np.ndarray, gpus: int, num_experts: int) -> np.ndarray:
    """Replicas of expert e on GPU g, int16 [L, G, E]."""
    L, P = layout_LP.shape
    S = P // gpus
    cnt = np.zeros((L, gpus, num_experts), dtype=np.int16)
    gpu_P = np.arange(P) // S
    np.add.at(cnt, (np.repeat(np.arange(L), P), np.tile(gpu_P, L), layout_LP.ravel()), 1)
    return cnt


def refine_swaps(layout_LP, w_WLP, gpus: int, num_experts: int, pin_LP=None, nodes: int = 1,
                 max_iter: int = 2000, tol: float = 1e-9, power: float | None = None):
    """Greedy best-swap descent on the busiest GPU. Returns (layout_LP, w_WLP, pin_LP) permuted copies.

    Each step, per layer: h = GPU with the largest load over all windows; among all swaps of a slot on h
    with a slot on another GPU (no duplicate expert on a GPU, pins respected) take the one minimising
    the larger of the two new loads (max over windows); apply it if that is below h's current load.
    With ``power`` p, the swap instead minimises sum over windows of load**p on the two GPUs (a smooth
    stand-in for the max that keeps improving the runner-up windows once the max is stuck)."""
    lay = np.array(layout_LP, dtype=np.int64)
    w = np.array(w_WLP, dtype=np.float64)
    if w.ndim == 2:
        w = w[None]
    W, L, P = w.shape
    S = P // gpus
    pin = None if pin_LP is None else np.array(pin_LP, dtype=np.int64)
    gpu_P = np.arange(P) // S
    node_P = gpu_P // (gpus // nodes)
    cnt = _presence(lay, gpus, num_experts)
    load = w.reshape(W, L, gpus, S).sum(-1)
    active = np.arange(L)
    ar_S = np.arange(S)
    for _ in range(max_iter):
        if active.size == 0:
            break
        A = active.size
        la = load[:, active]                      # [W, A, G]
        F = la.max(0)                             # [A, G]
        h = F.argmax(1)                           # [A]
        Fh = F[np.arange(A), h]
        hs = h[:, None] * S + ar_S                # [A, S]
        wa = w[:, active]                         # [W, A, P]
        wh = np.take_along_axis(wa, np.broadcast_to(hs, (W, A, S)), axis=2)  # [W, A, S]
        lh = la[:, np.arange(A), h]               # [W, A]
        d = wh[..., :, None] - wa[..., None, :]   # [W, A, S, P] load leaving h
        new_h = lh[..., None, None] - d
        new_g = la[:, :, gpu_P][..., None, :] + d
        if power is None:
            cand = np.maximum(new_h, new_g).max(0)    # [A, S, P]
            ref = Fh
        else:
            cand = (np.maximum(new_h, 0) ** power + np.maximum(new_g, 0) ** power).sum(0)
            ref = (lh[..., None] ** power + la[:, :, gpu_P] ** power).sum(0)   # [A, P] current
            cand = cand - ref[:, None, :]
            ref = np.zeros(A)
        ea = lay[active]
        ei = np.take_along_axis(ea, hs, axis=1)   # [A, S]
        ca = cnt[active]
        bad = ca[np.arange(A)[:, None, None], gpu_P[None, None, :], ei[:, :, None]] > 0  # e_i on g
        bad |= gpu_P[None, None, :] == h[:, None, None]
        bad |= (np.take_along_axis(ca[np.arange(A), h], ea, axis=1) > 0)[:, None, :]  # e_j on h
        if pin is not None:
            pa = pin[active]
            pi = np.take_along_axis(pa, hs, axis=1)
            node_h = h // (gpus // nodes)
            bad |= (pi[:, :, None] >= 0) & (pi[:, :, None] != node_P[None, None, :])
            bad |= ((pa >= 0) & (pa != node_h[:, None]))[:, None, :]
        cand = np.where(bad, np.inf, cand).reshape(A, S * P)
        k = cand.argmin(1)
        best = cand[np.arange(A), k]
        ok = best < (ref * (1 - tol) if power is None else -tol * (lh ** power).sum(0))
        if not ok.any():
            break
        li = active[ok]
        i = hs[ok, k[ok] // P]
        j = k[ok] % P
        e_i, e_j = lay[li, i], lay[li, j]
        gi, gj = gpu_P[i], gpu_P[j]
        cnt[li, gi, e_i] -= 1
        cnt[li, gj, e_j] -= 1
        cnt[li, gi, e_j] += 1
        cnt[li, gj, e_i] += 1
        lay[li, i], lay[li, j] = e_j, e_i
        wi, wj = w[:, li, i].copy(), w[:, li, j].copy()
        w[:, li, i], w[:, li, j] = wj, wi
        load[:, li, gi] += wj - wi
        load[:, li, gj] += wi - wj
        if pin is not None:
            pin[li, i], pin[li, j] = pin[li, j], pin[li, i]
        active = li
    return lay, w, pin

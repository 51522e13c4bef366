"""Replica-count refinement: turn one spare replica of expert a (a keeps >= 1 replica) into a replica of
an expert b held by the busiest GPU, when that lowers the largest GPU load (max over windows). This
changes per-replica loads of a and b on every GPU that holds them, which swaps alone cannot do.

Shapes: layout_LP [L, P]; counts_WLE [W, L, E] per-window loads (normalise windows first if they
should weigh equally); pin_LP [L, P] node a content must stay on (-1 = free; pinned slots are never
reassigned).
"""
from __future__ import annotations

import numpy as np

from .loads import replica_counts, slot_weights
from .refine import _presence, refine_swaps


def refine_replicas(layout_LP, counts_WLE, gpus: int, pin_LP=None, max_iter: int = 200,
                    candidates: int = 64, tol: float = 1e-9) -> tuple[np.ndarray, int]:
    """Greedy replica reassignment; returns (layout_LP, moves applied)."""
    lay = np.array(layout_LP, dtype=np.int64)
    c = np.asarray(counts_WLE, dtype=np.float64)
    if c.ndim == 2:
        c = c[None]
    W, L, E = c.shape
    P = lay.shape[1]
    S = P // gpus
    gpu_P = np.arange(P) // S
    rep = replica_counts(lay, E)
    cnt = _presence(lay, gpus, E)
    active = np.arange(L)
    moves = 0
    M = min(P, candidates)
    for _ in range(max_iter):
        if active.size == 0:
            break
        A = active.size
        ar = np.arange(A)
        la, ca, ra, ka = lay[active], c[:, active], rep[active], cnt[active]
        load = slot_weights(ca, la).reshape(W, A, gpus, S).sum(-1)          # [W, A, G]
        F = load.max(0)
        h = F.argmax(1)
        Fh = F[ar, h]
        b = la[ar[:, None], h[:, None] * S + np.arange(S)]                    # [A, S]
        free = np.take_along_axis(ra, la, axis=1) >= 2
        if pin_LP is not None:
            free &= pin_LP[active] < 0
        pidx = np.argsort(~free, axis=1, kind="stable")[:, :M]                # [A, M] candidate slots
        pok = np.take_along_axis(free, pidx, axis=1)
        a = np.take_along_axis(la, pidx, axis=1)
        gp = gpu_P[pidx]
        rb = np.take_along_axis(ra, b, axis=1).astype(float)
        rA = np.take_along_axis(ra, a, axis=1).astype(float)
        cnt_b = ka[ar[:, None], :, b].astype(float)                            # [A, S, G]
        cnt_a = ka[ar[:, None], :, a].astype(float)                            # [A, M, G]
        onehot = (np.arange(gpus)[None, None, :] == gp[:, :, None]).astype(float)
        obj = np.full((A, S, M), -np.inf)
        for t in range(W):
            cb = np.take_along_axis(ca[t], b, axis=1)
            cA = np.take_along_axis(ca[t], a, axis=1)
            db = cb / rb - cb / (rb + 1)
            da = np.where(rA > 1, cA / np.maximum(rA - 1, 1) - cA / rA, 0.0)
            new = (load[t][:, None, None, :] - db[:, :, None, None] * cnt_b[:, :, None, :]
                   + da[:, None, :, None] * cnt_a[:, None, :, :])
            fix = (cb / (rb + 1))[:, :, None] - (cA / rA + da)[:, None, :]     # [A, S, M] at GPU gp
            new += fix[..., None] * onehot[:, None, :, :]
            obj = np.maximum(obj, new.max(-1))
        bad = (a[:, None, :] == b[:, :, None]) | ~pok[:, None, :]
        bad |= ka[ar[:, None, None], gp[:, None, :], b[:, :, None]] > 0           # b already on gp
        obj = np.where(bad, np.inf, obj).reshape(A, S * M)
        k = obj.argmin(1)
        ok = obj[ar, k] < Fh * (1 - tol)
        if not ok.any():
            break
        li = active[ok]
        bi = b[ok, k[ok] // M]
        pi = pidx[ok, k[ok] % M]
        ai = lay[li, pi]
        gi = gpu_P[pi]
        lay[li, pi] = bi
        rep[li, ai] -= 1
        rep[li, bi] += 1
        cnt[li, gi, ai] -= 1
        cnt[li, gi, bi] += 1
        moves += int(ok.sum())
        active = li
    return lay, moves


def refine_all(layout_LP, counts_WLE, gpus: int, pin_LP=None, nodes: int = 1, rounds: int = 4,
               replica_moves: bool = True):
    """Alternate swap refinement and replica reassignment until neither helps. Returns (layout, pin)."""
    c = np.asarray(counts_WLE, dtype=np.float64)
    if c.ndim == 2:
        c = c[None]
    E = c.shape[-1]
    lay, pin = np.asarray(layout_LP, dtype=np.int64), pin_LP
    for _ in range(rounds):
        lay, _, pin = refine_swaps(lay, slot_weights(c, lay), gpus, E, pin_LP=pin, nodes=nodes)
        if not replica_moves:
            break
        lay, moved = refine_replicas(lay, c, gpus, pin_LP=pin)
        if moved == 0:
            break
    return lay, pin

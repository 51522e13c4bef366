"""Replica-count refinement: turn one spare replica of expert a (a keeps >= 1 replica) into a replica of
an expert b held by the busiest GPU, when that lowers the largest GPU load (max over windows). This
changes per-replica loads of a and b on every GPU that holds them, which swaps alone cannot do.

Shapes: layout_LP [L, P]; counts_WLE [W, L, E] per-window loads (normalise windows first if they
should weigh equally); pin_LP [L, P] node a content must stay on (-1 = free; pinned slots are never
reassigned). Inside the loop A are the active layers, V the candidate spare slots (at most `candidates`).
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.loadmodel import replica_counts, slot_weights

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
    num_cand = min(P, candidates)
    for _ in range(max_iter):
        if active.size == 0:
            break
        A = active.size
        ar = np.arange(A)
        lay_AP, counts_WAE, rep_AE, presence_AGE = lay[active], c[:, active], rep[active], cnt[active]
        load = slot_weights(counts_WAE, lay_AP).reshape(W, A, gpus, S).sum(-1)          # [W, A, G]
        F = load.max(0)
        h = F.argmax(1)
        Fh = F[ar, h]
        hot_AS = lay_AP[ar[:, None], h[:, None] * S + np.arange(S)]            # experts on the busiest GPU
        free = np.take_along_axis(rep_AE, lay_AP, axis=1) >= 2                 # spare replicas
        if pin_LP is not None:
            free &= pin_LP[active] < 0
        pidx = np.argsort(~free, axis=1, kind="stable")[:, :num_cand]         # [A, cand] candidate slots
        pok = np.take_along_axis(free, pidx, axis=1)
        spare_AV = np.take_along_axis(lay_AP, pidx, axis=1)                   # their experts
        gp = gpu_P[pidx]
        rep_hot = np.take_along_axis(rep_AE, hot_AS, axis=1).astype(float)
        rep_spare = np.take_along_axis(rep_AE, spare_AV, axis=1).astype(float)
        on_gpu_hot = presence_AGE[ar[:, None], :, hot_AS].astype(float)          # [A, S, G]
        on_gpu_spare = presence_AGE[ar[:, None], :, spare_AV].astype(float)      # [A, cand, G]
        onehot = (np.arange(gpus)[None, None, :] == gp[:, :, None]).astype(float)
        obj = np.full((A, S, num_cand), -np.inf)
        for t in range(W):
            count_hot = np.take_along_axis(counts_WAE[t], hot_AS, axis=1)
            count_spare = np.take_along_axis(counts_WAE[t], spare_AV, axis=1)
            drop_hot = count_hot / rep_hot - count_hot / (rep_hot + 1)   # per-replica load a new replica removes
            rise_spare = np.where(rep_spare > 1, count_spare / np.maximum(rep_spare - 1, 1) - count_spare / rep_spare, 0.0)
            new = (load[t][:, None, None, :] - drop_hot[:, :, None, None] * on_gpu_hot[:, :, None, :]
                   + rise_spare[:, None, :, None] * on_gpu_spare[:, None, :, :])
            fix = (count_hot / (rep_hot + 1))[:, :, None] - (count_spare / rep_spare + rise_spare)[:, None, :]  # at GPU gp
            new += fix[..., None] * onehot[:, None, :, :]
            obj = np.maximum(obj, new.max(-1))
        bad = (spare_AV[:, None, :] == hot_AS[:, :, None]) | ~pok[:, None, :]
        bad |= presence_AGE[ar[:, None, None], gp[:, None, :], hot_AS[:, :, None]] > 0  # already on gp
        obj = np.where(bad, np.inf, obj).reshape(A, S * num_cand)
        k = obj.argmin(1)
        ok = obj[ar, k] < Fh * (1 - tol)
        if not ok.any():
            break
        li = active[ok]
        bi = hot_AS[ok, k[ok] // num_cand]
        pi = pidx[ok, k[ok] % num_cand]
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

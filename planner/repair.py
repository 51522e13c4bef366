"""Migration-aware repair: from the current layout, the best layout reachable within k expert moves.

One move = one expert's weights copied into one slot. Steps, greedy per layer on the busiest GPU:
a slot swap between two GPUs (2 moves) or turning a spare replica into a replica of an expert on the
busiest GPU (1 move). Each layer yields a sequence of (cost, imbalance) steps; a total budget is spent
across layers on the steps with the largest imbalance drop per move first (each layer's steps in order).

Shapes: counts_LE [L, E] (or [T, L, E]: the blend of normalised windows is used), current_LP [L, P].
"""
from __future__ import annotations

import numpy as np

from .loads import as_counts, check_layout, layer_imbalance, replica_counts, slot_weights
from .refine import refine_swaps
from .replicas import refine_replicas
from .robust import scenarios


def _target(counts) -> np.ndarray:
    c = as_counts(counts, "counts", ndim=(2, 3))
    return scenarios(c)[0] if c.ndim == 3 else c


def layer_sequences(counts, current_LP, gpus: int, max_moves: int):
    """Per-layer greedy steps: (layouts [M+1, L, P], cost_ML [M, L] moves per step, imb [M+1, L])."""
    c = _target(counts)
    lay = check_layout(current_LP, c.shape[1], gpus)
    if lay.shape[0] != c.shape[0]:
        raise ValueError(f"layout has {lay.shape[0]} layers, counts have {c.shape[0]}")
    E = c.shape[1]
    lays, costs, imbs = [lay], [], [layer_imbalance(c, lay, gpus)]
    spent = np.zeros(lay.shape[0], dtype=np.int64)
    while True:
        cur, imb = lays[-1], imbs[-1]
        sw, _, _ = refine_swaps(cur, slot_weights(c, cur), gpus, E, max_iter=1)
        rp, _ = refine_replicas(cur, c, gpus, max_iter=1)
        i_sw, i_rp = layer_imbalance(c, sw, gpus), layer_imbalance(c, rp, gpus)
        g_sw = np.where(spent + 2 <= max_moves, (imb - i_sw) / 2, 0.0)
        g_rp = np.where(spent + 1 <= max_moves, imb - i_rp, 0.0)
        use_rp = g_rp >= g_sw
        gain = np.where(use_rp, g_rp, g_sw)
        step = gain > 1e-12
        if not step.any():
            break
        cost = np.where(step, np.where(use_rp, 1, 2), 0)
        nxt = np.where((step & use_rp)[:, None], rp, np.where(step[:, None], sw, cur))
        lays.append(nxt)
        costs.append(cost)
        imbs.append(np.where(step, np.where(use_rp, i_rp, i_sw), imb))
        spent += cost
    return np.stack(lays), np.array(costs).reshape(-1, lay.shape[0]), np.stack(imbs)


def repair_curve(counts, current_LP, gpus: int, max_moves: int):
    """Spend up to ``max_moves`` moves in total over the layers. Returns (layout_LP, curve) where curve is
    a list of (moves used, mean imbalance, worst imbalance) after each step taken; mean and worst are over
    the layers with tokens (all layers when none has any), as everywhere else."""
    if max_moves < 0:
        raise ValueError(f"move budget must be >= 0, got {max_moves}")
    lays, cost, imb = layer_sequences(counts, current_LP, gpus, max_moves)
    L = lays.shape[1]
    active = _target(counts).sum(1) > 0
    a = active if active.any() else np.ones_like(active)
    taken = np.zeros(L, dtype=np.int64)
    cur_imb = imb[0].copy()
    used = 0
    curve = [(0, float(cur_imb[a].mean()), float(cur_imb[a].max()))]
    while True:
        best, best_l = 0.0, -1
        for l in np.nonzero(taken < cost.shape[0])[0]:
            k = taken[l]
            cst = cost[k, l]
            if cst == 0 or used + cst > max_moves:
                continue
            g = (imb[k, l] - imb[k + 1, l]) / cst
            if g > best:
                best, best_l = g, l
        if best_l < 0:
            break
        taken[best_l] += 1
        used += int(cost[taken[best_l] - 1, best_l])
        cur_imb[best_l] = imb[taken[best_l], best_l]
        curve.append((used, float(cur_imb[a].mean()), float(cur_imb[a].max())))
    out = lays[taken, np.arange(L)]
    return out, curve


def moves_between(old_LP, new_LP) -> int:
    """Expert moves (slots whose content changed) from one layout to another."""
    return int((np.asarray(old_LP) != np.asarray(new_LP)).sum())


def repair_plan(counts, current_LP, gpus: int, max_moves: int) -> dict:
    """CLI payload: repaired physical_to_logical_map plus the moves-vs-imbalance curve."""
    lay, curve = repair_curve(counts, current_LP, gpus, max_moves)
    c = _target(counts)
    imb = layer_imbalance(c, lay, gpus)
    active = c.sum(1) > 0
    a = active if active.any() else np.ones_like(active)
    return {"physical_to_logical_map": lay.tolist(), "policy": "repair", "gpus": gpus,
            "moves_budget": max_moves, "moves_used": moves_between(current_LP, lay),
            "predicted_imbalance": imb.round(6).tolist(),
            "predicted_balancedness": (1 / imb).round(6).tolist(),
            "replica_counts": replica_counts(lay, c.shape[1]).tolist(),
            "moves_vs_imbalance": [{"moves": m, "mean_imbalance": mi, "worst_imbalance": wi}
                                   for m, mi, wi in curve],
            "summary": {"mean_imbalance": float(imb[a].mean()), "worst_imbalance": float(imb[a].max()),
                        "moves_used": moves_between(current_LP, lay)}}

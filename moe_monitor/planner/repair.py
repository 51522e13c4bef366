"""Migration-aware repair: from the current layout, the best layout reachable within a budget of moves.

One move = one expert's weights (of one layer) copied onto a GPU that did not hold it in the current layout
(``experts_copied``). Greedy per layer on the busiest GPU: a slot swap between two GPUs or a spare replica
turned into one of an expert on the busiest GPU, each costing what it adds to ``experts_copied``; the budget
goes across layers to the steps with the largest imbalance drop per move first.

Shapes: L layers, E experts, P slots, G GPUs, W windows, X greedy steps. counts_LE [L, E] or counts_WLE
[W, L, E] (then the blend of per-layer normalised windows is balanced); current_LP [L, P].
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from moe_monitor.core.counts import as_counts
from moe_monitor.core.loadmodel import replica_counts, slot_weights

from .loads import check_layout, check_size, layer_imbalance
from .refine import refine_swaps
from .replicas import refine_replicas
from .robust import scenarios


def _balanced_counts_LE(counts: ArrayLike) -> np.ndarray:
    """The counts the repair balances, [L, E]: counts_LE as given, or the blend of counts_WLE's windows."""
    c = as_counts(counts, "counts", ndim=(2, 3))
    return scenarios(c)[0] if c.ndim == 3 else c


def _held_LGE(layout_LP: np.ndarray, gpus: int, num_experts: int) -> np.ndarray:
    """Bool [L, G, E]: GPU g holds (a replica of) expert e in layer l."""
    L, P = layout_LP.shape
    held = np.zeros((L, gpus, num_experts), dtype=bool)
    held[np.arange(L)[:, None], np.arange(P) // (P // gpus), layout_LP] = True
    return held


def _experts_copied_L(held_before_LGE: np.ndarray, after_LP: np.ndarray, gpus: int) -> np.ndarray:
    """Moves per layer, int64 [L] (see experts_copied), from what the GPUs held before ([L, G, E], E above
    every expert id of after_LP)."""
    new_LGE = _held_LGE(after_LP, gpus, held_before_LGE.shape[2]) & ~held_before_LGE
    return new_LGE.sum((1, 2)).astype(np.int64)


def _as_layouts(before_LP: ArrayLike, after_LP: ArrayLike, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(before_LP, dtype=np.int64), np.asarray(after_LP, dtype=np.int64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
        raise ValueError(f"layouts must be [layers, slots] with the same layers, got {a.shape} and {b.shape}")
    if gpus < 1 or a.shape[1] % gpus or b.shape[1] % gpus:
        raise ValueError(f"slots ({a.shape[1]}, {b.shape[1]}) do not split over {gpus} GPUs")
    if (a.size and a.min() < 0) or (b.size and b.min() < 0):
        raise ValueError("layouts hold negative expert ids")
    return a, b


def experts_copied(before_LP: ArrayLike, after_LP: ArrayLike, gpus: int) -> int:
    """Moves from one layout to another: one move = one expert's weights (of one layer) copied onto a GPU that
    did not hold that expert before, i.e. the (layer, GPU, expert) triples held after and not before. Dropping
    a replica costs nothing; the layouts may have different slot counts (a full re-plan may change R)."""
    a, b = _as_layouts(before_LP, after_LP, gpus)
    E = int(max(a.max(initial=-1), b.max(initial=-1))) + 1
    return int(_experts_copied_L(_held_LGE(a, gpus, E), b, gpus).sum())


def _greedy_steps(counts_LE: np.ndarray, current_LP: ArrayLike, gpus: int, max_moves: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-layer greedy steps from current_LP, each layer within max_moves: (layouts_XLP [X+1, L, P],
    moves_XL [X+1, L] experts_copied per layer from current_LP, imbalance_XL [X+1, L], steps_L [L] the steps
    each layer took: rows past a layer's last step repeat it)."""
    E = counts_LE.shape[1]
    start = check_layout(current_LP, E, gpus)
    if start.shape[0] != counts_LE.shape[0]:
        raise ValueError(f"layout has {start.shape[0]} layers, counts have {counts_LE.shape[0]}")
    L = start.shape[0]
    check_size(L, E, gpus, start.shape[1])
    held_LGE = _held_LGE(start, gpus, E)
    layouts, moves, imbalances = [start], [np.zeros(L, dtype=np.int64)], [layer_imbalance(counts_LE, start, gpus)]
    steps_L = np.zeros(L, dtype=np.int64)
    while True:
        cur, imb, used = layouts[-1], imbalances[-1], moves[-1]
        swapped, _, _ = refine_swaps(cur, slot_weights(counts_LE, cur), gpus, E, max_iter=1)
        replicated, _ = refine_replicas(cur, counts_LE, gpus, max_iter=1)
        candidates = []
        for lay in (swapped, replicated):
            m = _experts_copied_L(held_LGE, lay, gpus)
            i = layer_imbalance(counts_LE, lay, gpus)
            drop, cost = imb - i, m - used
            per_move = np.where(cost > 0, drop / np.maximum(cost, 1), np.where(drop > 0, np.inf, 0.0))
            candidates.append((lay, m, i, np.where((m <= max_moves) & (drop > 1e-12), per_move, 0.0)))
        (sw, m_sw, i_sw, g_sw), (rp, m_rp, i_rp, g_rp) = candidates
        use_rp = g_rp >= g_sw
        step = np.where(use_rp, g_rp, g_sw) > 0
        if not step.any():
            break
        layouts.append(np.where((step & use_rp)[:, None], rp, np.where(step[:, None], sw, cur)))
        moves.append(np.where(step, np.where(use_rp, m_rp, m_sw), used))
        imbalances.append(np.where(step, np.where(use_rp, i_rp, i_sw), imb))
        steps_L += step
    return np.stack(layouts), np.stack(moves), np.stack(imbalances), steps_L


def repair_curve(counts: ArrayLike, current_LP: ArrayLike, gpus: int, max_moves: int
                 ) -> tuple[np.ndarray, list[tuple[int, float, float]]]:
    """Spend up to ``max_moves`` moves (experts_copied from current_LP) in total over the layers. Returns
    (layout_LP, curve) where curve is a list of (moves, mean imbalance, worst imbalance) for the current layout
    and after each step taken; the last row's moves == experts_copied(current_LP, layout_LP, gpus). Mean and
    worst are over the layers with tokens (all layers when none has any), as everywhere else."""
    if max_moves < 0:
        raise ValueError(f"move budget must be >= 0, got {max_moves}")
    c = _balanced_counts_LE(counts)
    layouts, moves, imb, steps_L = _greedy_steps(c, current_LP, gpus, max_moves)
    L = layouts.shape[1]
    active = c.sum(1) > 0
    a = active if active.any() else np.ones_like(active)
    taken = np.zeros(L, dtype=np.int64)
    cur_imb = imb[0].copy()
    used = 0
    curve = [(0, float(cur_imb[a].mean()), float(cur_imb[a].max()))]
    while True:
        best, best_layer = 0.0, -1
        for layer in np.flatnonzero(taken < steps_L):
            k = taken[layer]
            cost = int(moves[k + 1, layer] - moves[k, layer])
            if used + cost > max_moves:
                continue
            drop = float(imb[k, layer] - imb[k + 1, layer])
            per_move = drop / cost if cost > 0 else np.inf
            if per_move > best:
                best, best_layer = per_move, int(layer)
        if best_layer < 0:
            break
        k = taken[best_layer]
        used += int(moves[k + 1, best_layer] - moves[k, best_layer])
        taken[best_layer] += 1
        cur_imb[best_layer] = imb[k + 1, best_layer]
        curve.append((used, float(cur_imb[a].mean()), float(cur_imb[a].max())))
    return layouts[taken, np.arange(L)], curve


def repair_plan(counts: ArrayLike, current_LP: ArrayLike, gpus: int, max_moves: int) -> dict:
    """CLI payload: repaired physical_to_logical_map, its moves (experts_copied) and the moves-vs-imbalance
    curve."""
    lay, curve = repair_curve(counts, current_LP, gpus, max_moves)
    c = _balanced_counts_LE(counts)
    imb = layer_imbalance(c, lay, gpus)
    active = c.sum(1) > 0
    a = active if active.any() else np.ones_like(active)
    moves = experts_copied(current_LP, lay, gpus)
    return {"physical_to_logical_map": lay.tolist(), "policy": "repair", "gpus": gpus,
            "moves_budget": max_moves, "moves_used": moves,
            "predicted_imbalance": imb.round(6).tolist(),
            "predicted_balancedness": (1 / imb).round(6).tolist(),
            "replica_counts": replica_counts(lay, c.shape[1]).tolist(),
            "moves_vs_imbalance": [{"moves": m, "mean_imbalance": mi, "worst_imbalance": wi}
                                   for m, mi, wi in curve],
            "summary": {"mean_imbalance": float(imb[a].mean()), "worst_imbalance": float(imb[a].max()),
                        "moves_used": moves}}

"""Room for the lp dispatch: connect the GPUs through replicated experts.

Under lp dispatch (core.dispatch) load flows only between GPUs that share a replicated expert, so the lp levels
load only inside each connected component of that graph; a window-balanced layout leaves some GPUs alone. R
redundant slots give R links beyond one per replicated expert: a spanning tree for G <= R + 1 GPUs.
``connect_replicas`` swaps slot contents, cheapest first (the smallest change of the window's GPU loads), each
moving a replica into a smaller component, until one component is left or no swap merges any. Replica counts
never change, and no GPU gets two replicas of one expert.

Shapes: layout_LP [L, P]; weight_LE [L, E] (window load of each expert); slot p on GPU p // (P / G).
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.loadmodel import replica_counts

MAX_MERGES = 64       # swaps per layer at most


def gpu_components(layout_P: np.ndarray, replicas_E: np.ndarray, gpus: int) -> np.ndarray:
    """Component id int64 [G] of each GPU in the graph linking GPUs that share a replicated expert (one layer)."""
    S = layout_P.size // gpus
    gpu_P = np.arange(layout_P.size) // S
    parent = np.arange(gpus)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for e in np.flatnonzero(replicas_E > 1):
        g = np.unique(gpu_P[layout_P == e])
        root = find(int(g[0]))
        for other in g[1:]:
            parent[find(int(other))] = root
    return np.array([find(g) for g in range(gpus)], dtype=np.int64)


def _count(comp_G: np.ndarray) -> int:
    return int(np.unique(comp_G).size)


def connect_layer(layout_P: np.ndarray, weight_E: np.ndarray, gpus: int, max_merges: int = MAX_MERGES
                  ) -> np.ndarray:
    """One layer's layout [P] with its GPU components merged by slot swaps (module docstring)."""
    lay = np.array(layout_P, dtype=np.int64)
    E = weight_E.size
    S = lay.size // gpus
    gpu_P = np.arange(lay.size) // S
    rep_E = replica_counts(lay[None], E)[0]
    slot_w = weight_E[lay] / rep_E[lay]
    for _ in range(max_merges):
        comp = gpu_components(lay, rep_E, gpus)
        if _count(comp) == 1:
            break
        sizes = np.bincount(comp, minlength=gpus)
        held = np.zeros((gpus, E), dtype=bool)
        held[gpu_P, lay] = True
        flexible_P = rep_E[lay] > 1
        # into a smaller component: a fixed slot j on GPU b; out of a larger one: a replica slot i on GPU a
        small_P = sizes[comp[gpu_P]]
        i_idx = np.flatnonzero(flexible_P)
        j_idx = np.flatnonzero(~flexible_P)
        if i_idx.size == 0 or j_idx.size == 0:
            break
        ok = small_P[j_idx][None, :] < small_P[i_idx][:, None]
        ok &= comp[gpu_P[i_idx]][:, None] != comp[gpu_P[j_idx]][None, :]
        ok &= ~held[gpu_P[j_idx][None, :], lay[i_idx][:, None]]      # expert i not on b already
        ok &= ~held[gpu_P[i_idx][:, None], lay[j_idx][None, :]]      # expert j not on a already
        cost = np.where(ok, np.abs(slot_w[i_idx][:, None] - slot_w[j_idx][None, :]), np.inf)
        order = np.argsort(cost, axis=None)
        before = _count(comp)
        merged = False
        for k in order[:256]:
            if not np.isfinite(cost.flat[k]):
                break
            i, j = i_idx[k // j_idx.size], j_idx[k % j_idx.size]
            lay[i], lay[j] = lay[j], lay[i]
            if _count(gpu_components(lay, rep_E, gpus)) < before:
                slot_w[i], slot_w[j] = slot_w[j], slot_w[i]
                merged = True
                break
            lay[i], lay[j] = lay[j], lay[i]
        if not merged:
            break
    return lay


def connect_replicas(layout_LP, weight_LE, gpus: int) -> np.ndarray:
    """Layout [L, P] with each layer's GPUs linked into as few components as slot swaps reach."""
    lay = np.asarray(layout_LP, dtype=np.int64)
    w = np.asarray(weight_LE, dtype=np.float64)
    return np.stack([connect_layer(lay[layer], w[layer], gpus) for layer in range(lay.shape[0])])

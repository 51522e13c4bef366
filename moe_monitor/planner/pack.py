"""Replication and balanced packing primitives, vectorised across layers.

Shape legend: L layers, E experts, P = E + R physical slots, I items, B bins (GPUs or nodes).
"""
from __future__ import annotations

import numpy as np


def replicate_greedy(weight_LE: np.ndarray, num_slots: int, max_replicas: int | None = None) -> np.ndarray:
    """Replica counts [L, E] (int64, each >= 1, rows sum to ``num_slots``): every extra slot goes to the
    expert with the largest load per replica (ties: lowest id). Minimises the largest per-replica load.
    ``max_replicas`` (the GPUs, for layouts without two replicas of one expert on a GPU): no expert gets more;
    needs num_slots <= E * max_replicas. It changes nothing until some expert would pass it."""
    L, E = weight_LE.shape
    rep_LE = np.ones((L, E), dtype=np.int64)
    rows = np.arange(L)
    for _ in range(num_slots - E):
        per_replica = weight_LE / rep_LE
        if max_replicas is not None:
            per_replica[rep_LE >= max_replicas] = -np.inf
        e_L = np.argmax(per_replica, axis=1)
        rep_LE[rows, e_L] += 1
    return rep_LE


def expand_replicas(rep_LE: np.ndarray) -> np.ndarray:
    """Physical-to-logical rows [L, P] listing expert e ``rep_LE[l, e]`` times in id order."""
    L, E = rep_LE.shape
    return np.stack([np.repeat(np.arange(E), rep_LE[l]) for l in range(L)]).astype(np.int64)


def balanced_pack(weight_LI: np.ndarray, bins: int, forbid_dup_LI: np.ndarray | None = None) -> np.ndarray:
    """Bin of every item, int64 [L, I]: exactly I // bins items per bin; items heaviest-first, each onto the
    currently lightest bin that still has room (ties: lowest bin id).

    ``forbid_dup_LI`` (optional, int ids [L, I]): items with the same id never share a bin when avoidable
    (EPLB itself does not check this; pass None for parity)."""
    L, I = weight_LI.shape
    if I % bins:
        raise ValueError(f"{I} items cannot be packed evenly into {bins} bins")
    cap = I // bins
    order_LI = np.argsort(-weight_LI, axis=1, kind="stable")
    bin_LI = np.empty((L, I), dtype=np.int64)
    load_LB = np.zeros((L, bins))
    used_LB = np.zeros((L, bins), dtype=np.int64)
    rows = np.arange(L)
    if forbid_dup_LI is not None:
        ids = int(forbid_dup_LI.max()) + 1
        has_LBE = np.zeros((L, bins, ids), dtype=bool)
    for j in range(I):
        item_L = order_LI[:, j]
        key_LB = np.where(used_LB < cap, load_LB, np.inf)
        if forbid_dup_LI is not None:
            id_L = forbid_dup_LI[rows, item_L]
            clash_LB = has_LBE[rows, :, id_L]
            key2_LB = np.where(clash_LB, np.inf, key_LB)
            ok_L = np.asarray(np.isfinite(key2_LB).any(axis=1))
            key_LB = np.where(ok_L[:, None], key2_LB, key_LB)
        b_L = np.argmin(key_LB, axis=1)
        bin_LI[rows, item_L] = b_L
        load_LB[rows, b_L] += weight_LI[rows, item_L]
        used_LB[rows, b_L] += 1
        if forbid_dup_LI is not None:
            has_LBE[rows, b_L, id_L] = True
    return bin_LI


def layout_from_bins(items_LI: np.ndarray, bin_LI: np.ndarray, bins: int) -> np.ndarray:
    """Order items into slots bin-major: returns [L, I] with bin b's items in slots b*cap ... (b+1)*cap-1."""
    L, I = items_LI.shape
    order_LI = np.argsort(bin_LI * I + np.arange(I), axis=1, kind="stable")
    return np.take_along_axis(items_LI, order_LI, axis=1)

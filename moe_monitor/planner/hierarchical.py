"""Hierarchical planner with cross-node spares.

Experts form Q groups of consecutive ids, nodes M blocks of consecutive GPUs. Groups are packed onto nodes as
EPLB does and every expert's primary stays on its group's node (node-limited routing keeps working); unlike
EPLB the R redundant copies may live on any node (R/M spare slots each). The off-node token share is reported.

Shapes: counts_LE [L, E]; layout_LP [L, P]; home_LE [L, E] node of each expert's group; pin_LP [L, P] node a
slot's content must stay on (-1 for a spare).
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.counts import as_counts
from moe_monitor.core.loadmodel import slot_weights

from .eplb_ref import check_hierarchy, group_to_node
from .loads import check_shape, duplicates_on_gpu
from .pack import expand_replicas, replicate_greedy
from .replicas import refine_all


def pinned_pack(weight_LI, expert_LI, pin_LI, gpus: int, nodes: int, num_experts: int) -> np.ndarray:
    """GPU of every item [L, I]: heaviest first onto the lightest GPU with a free slot that holds no
    replica of the same expert; a pinned item only on its node; a spare only where its node keeps room
    for the primaries still to come."""
    L, I = weight_LI.shape
    S = I // gpus
    per_node = gpus // nodes
    node_G = np.arange(gpus) // per_node
    order = np.argsort(-weight_LI, axis=1, kind="stable")
    rows = np.arange(L)
    gpu_LI = np.empty((L, I), dtype=np.int64)
    load = np.zeros((L, gpus))
    used = np.zeros((L, gpus), dtype=np.int64)
    has = np.zeros((L, gpus, num_experts), dtype=bool)
    pins_left = np.zeros((L, nodes), dtype=np.int64)
    for n in range(nodes):
        pins_left[:, n] = (pin_LI == n).sum(1)
    for j in range(I):
        it = order[:, j]
        e, pn = expert_LI[rows, it], pin_LI[rows, it]
        node_free = (S - used).reshape(L, nodes, per_node).sum(2)                       # [L, M]
        ok = (used < S) & ~has[rows, :, e]
        spare_ok = (node_free > pins_left)[:, node_G]
        ok &= np.where(pn[:, None] >= 0, node_G[None, :] == pn[:, None], spare_ok)
        key = np.where(ok, load, np.inf)
        none = ~np.isfinite(key).any(1)
        if none.any():  # fall back: any GPU with room that the pin allows (duplicates tolerated)
            ok2 = (used < S) & np.where(pn[:, None] >= 0, node_G[None, :] == pn[:, None], spare_ok)
            key[none] = np.where(ok2[none], load[none], np.inf)
        g = key.argmin(1)
        gpu_LI[rows, it] = g
        load[rows, g] += weight_LI[rows, it]
        used[rows, g] += 1
        has[rows, g, e] = True
        pins_left[rows[pn >= 0], pn[pn >= 0]] -= 1
    return gpu_LI


def respare_duplicates(layout_LP, pin_LP, counts_LE, gpus: int) -> np.ndarray:
    """Layout [L, P] in which every spare slot that repeats an expert already on its GPU serves instead the
    expert, absent from that GPU, with the most tokens per replica.

    Packing may be forced into such a repeat when a node's spares cannot all go elsewhere (e.g. one GPU per
    node and two spares of experts homed there); of two copies on one GPU at most one is a primary, so a
    spare is always there to give away, and a GPU with a repeat holds fewer than S <= E distinct experts."""
    lay = layout_LP.copy()
    L, P = lay.shape
    S = P // gpus
    for l in np.flatnonzero(duplicates_on_gpu(lay, gpus)):
        rep_E = np.bincount(lay[l], minlength=counts_LE.shape[1])
        for g in range(gpus):
            slots = np.arange(g * S, (g + 1) * S)
            seen: set[int] = set()
            for p in sorted(slots, key=lambda q: pin_LP[l, q] < 0):     # primaries claim their expert first
                e = int(lay[l, p])
                if e not in seen:
                    seen.add(e)
                    continue
                absent = np.ones(len(rep_E), dtype=bool)
                absent[list(seen | set(lay[l, slots].tolist()))] = False
                per_replica = np.where(absent, counts_LE[l] / (rep_E + 1), -np.inf)
                new = int(per_replica.argmax())
                rep_E[e] -= 1
                rep_E[new] += 1
                lay[l, p] = new
                seen.add(new)
    return lay


def plan_hierarchical(counts_LE, gpus: int, redundant: int, nodes: int, groups: int,
                      refine: bool = True, weights_WLE=None):
    """Layout [L, P] and home node of every expert [L, E].

    ``weights_WLE`` (optional) are the per-window loads the refinement balances at once (defaults to
    ``counts_LE`` itself); replication and packing use ``counts_LE``."""
    c = as_counts(counts_LE)
    L, E = c.shape
    S = check_shape(E, gpus, redundant)
    check_hierarchy(E, gpus, redundant, nodes, groups)
    node_LQ = group_to_node(c, nodes, groups)
    home_LE = np.repeat(node_LQ, E // groups, axis=1)
    rep = replicate_greedy(c, E + redundant, max_replicas=gpus)
    phys = expand_replicas(rep)
    first = np.concatenate([np.ones((L, 1), bool), np.diff(phys, axis=1) != 0], axis=1)
    pin = np.where(first, np.take_along_axis(home_LE, phys, axis=1), -1)
    w = np.take_along_axis(c / rep, phys, axis=1)
    gpu = pinned_pack(w, phys, pin, gpus, nodes, E)
    order = np.argsort(gpu * phys.shape[1] + np.arange(phys.shape[1]), axis=1, kind="stable")
    lay = np.take_along_axis(phys, order, axis=1)
    pin = np.take_along_axis(pin, order, axis=1)
    lay = respare_duplicates(lay, pin, c, gpus)
    if refine:
        win = c[None] if weights_WLE is None else as_counts(weights_WLE, ndim=(3,))
        lay, pin = refine_all(lay, win, gpus, pin_LP=pin, nodes=nodes)
    del S
    return lay, home_LE


def off_node_share(counts_LE, layout_LP, home_LE, gpus: int, nodes: int) -> np.ndarray:
    """Share of each layer's tokens served off their expert's home node (even split), [L]."""
    c = as_counts(counts_LE)
    L, P = layout_LP.shape
    node_P = (np.arange(P) // (P // gpus)) // (gpus // nodes)
    w = slot_weights(c, layout_LP)
    off = node_P[None, :] != np.take_along_axis(home_LE, layout_LP, axis=1)
    tot = c.sum(1)
    return np.where(tot > 0, (w * off).sum(1) / np.where(tot > 0, tot, 1.0), 0.0)

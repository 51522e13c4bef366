"""Lower bounds on the busiest GPU's load, per layer, expressed as imbalance (max/mean GPU load).

Shapes: counts_LE [L, E]; every function returns float64 [L] (1.0 for layers without traffic).
- fractional: max/mean = 1 (perfectly divisible load, W/G per GPU).
- replica: some GPU holds the heaviest replica; with P slots the best replication makes the heaviest
  per-replica load as small as possible (greedy largest-per-replica is optimal for that).
- slot (R = 0): among the k*G + 1 heaviest experts some GPU holds k + 1 of them (pigeonhole); the GPU
  of the heaviest expert holds S - 1 more, at least the S - 1 lightest.
- group partition (hierarchical, replicas kept inside a node): the best split of K groups over N
  nodes (K/N each) leaves some node with at least that node's total, spread over its G/N GPUs.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np

from .loads import as_counts, check_shape
from .pack import replicate_greedy


def _ratio(max_L: np.ndarray, total_L: np.ndarray, gpus: int) -> np.ndarray:
    mean_L = total_L / gpus
    return np.where(mean_L > 0, max_L / np.where(mean_L > 0, mean_L, 1.0), 1.0)


def fractional_bound(counts_LE) -> np.ndarray:
    """Imbalance bound 1.0 for every layer (load divides perfectly)."""
    return np.ones(as_counts(counts_LE).shape[0])


def replica_bound(counts_LE, gpus: int, redundant: int) -> np.ndarray:
    """max(1, heaviest per-replica load under the best replication / mean GPU load), [L]."""
    c = as_counts(counts_LE)
    E = c.shape[1]
    check_shape(E, gpus, redundant)
    rep = replicate_greedy(c, E + redundant)
    return np.maximum(1.0, _ratio((c / rep).max(1), c.sum(1), gpus))


def slot_bound(counts_LE, gpus: int) -> np.ndarray:
    """R = 0 pigeonhole bound [L]: max over k of the sum of the (k+1) lightest of the k*G+1 heaviest."""
    c = as_counts(counts_LE)
    L, E = c.shape
    s = -np.sort(-c, axis=1)
    per_gpu = E // gpus
    # the GPU holding the heaviest expert also holds S - 1 others, at least the S - 1 lightest
    best = s[:, 0] + (s[:, E - (per_gpu - 1):].sum(1) if per_gpu > 1 else 0.0)
    k = 1
    while k * gpus + 1 <= E:
        best = np.maximum(best, s[:, k * gpus - k:k * gpus + 1].sum(1))
        k += 1
    return np.maximum(1.0, _ratio(best, c.sum(1), gpus))


def _partitions(items: tuple, size: int):
    """All splits of ``items`` into unordered blocks of ``size``."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for others in combinations(rest, size - 1):
        block = (first,) + others
        remaining = tuple(x for x in rest if x not in others)
        for tail in _partitions(remaining, size):
            yield [block] + tail


def group_partition_bound(counts_LE, gpus: int, nodes: int, groups: int, max_enum: int = 20000) -> np.ndarray:
    """Group floor [L]: min over balanced group->node splits of the heaviest node, per GPU, / mean GPU
    load. Exact by enumeration when there are at most ``max_enum`` splits, else a pigeonhole bound."""
    c = as_counts(counts_LE)
    L, E = c.shape
    if E % groups or groups % nodes or gpus % nodes:
        raise ValueError("groups must split the experts, nodes must split the groups and the GPUs")
    g_LK = c.reshape(L, groups, E // groups).sum(-1)
    per = groups // nodes
    total = c.sum(1)
    splits = []
    for part in _partitions(tuple(range(groups)), per):
        splits.append(part)
        if len(splits) > max_enum:
            splits = None
            break
    if splits:
        onehot = np.zeros((len(splits), nodes, groups))
        for q, part in enumerate(splits):
            for n, block in enumerate(part):
                onehot[q, n, list(block)] = 1.0
        node_LQN = np.einsum("lk,qnk->lqn", g_LK, onehot)
        node_max_L = node_LQN.max(2).min(1)
    else:
        s = -np.sort(-g_LK, axis=1)
        node_max_L = np.maximum(total / nodes, s[:, 0])
        k = 1
        while k * nodes + 1 <= groups:
            node_max_L = np.maximum(node_max_L, s[:, k * nodes - k:k * nodes + 1].sum(1))
            k += 1
    return np.maximum(1.0, _ratio(node_max_L / (gpus // nodes), total, gpus))


def best_bound(counts_LE, gpus: int, redundant: int) -> np.ndarray:
    """The tightest of the bounds above that holds for any layout with R redundant slots, [L]."""
    b = replica_bound(counts_LE, gpus, redundant)
    if redundant == 0:
        b = np.maximum(b, slot_bound(counts_LE, gpus))
    return b

"""Lower bounds on the busiest GPU's load, per layer, as imbalance (max/mean GPU load). counts_LE [L, E] in;
every function returns float64 [L] (1.0 for layers without traffic).
- fractional: 1 (perfectly divisible load);
- replica: some GPU holds the heaviest replica, at best after greedy largest-per-replica replication;
- rule: the same with at most G replicas per expert (no GPU holds two replicas of one expert);
- slot (R = 0): among the k*G + 1 heaviest experts some GPU holds k + 1 (pigeonhole), plus S - k - 1 others;
- cardinality (R = 0): the k heaviest experts on some j GPUs, with the j*S - k lightest, whatever j;
- group partition (hierarchical): the best split of Q groups over M nodes leaves some node at least its
  total over its G/M GPUs.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np

from moe_monitor.core.counts import as_counts

from .loads import check_shape
from .pack import replicate_greedy


def _ratio(max_L: np.ndarray, total_L: np.ndarray, gpus: int) -> np.ndarray:
    mean_L = total_L / gpus
    return np.where(mean_L > 0, max_L / np.where(mean_L > 0, mean_L, 1.0), 1.0)


def replica_bound(counts_LE, gpus: int, redundant: int) -> np.ndarray:
    """max(1, heaviest per-replica load under the best replication / mean GPU load), [L]. The 1 is the
    fractional bound W/G: the load divided perfectly over the GPUs."""
    c = as_counts(counts_LE)
    E = c.shape[1]
    check_shape(E, gpus, redundant)
    rep = replicate_greedy(c, E + redundant)
    return np.maximum(1.0, _ratio((c / rep).max(1), c.sum(1), gpus))


def rule_bound(counts_LE, gpus: int, redundant: int) -> np.ndarray:
    """replica_bound under the planner's rule (no GPU holds two replicas of one expert, so at most G replicas
    each): max(1, the smallest heaviest replica with at most G replicas per expert / mean GPU load), [L]. Not
    a bound for layouts that break the rule (EPLB's may)."""
    c = as_counts(counts_LE)
    E = c.shape[1]
    check_shape(E, gpus, redundant)
    rep = replicate_greedy(c, E + redundant, max_replicas=gpus)
    return np.maximum(replica_bound(c, gpus, redundant), _ratio((c / rep).max(1), c.sum(1), gpus))


def slot_bound(counts_LE, gpus: int) -> np.ndarray:
    """R = 0 pigeonhole bound [L].

    With exactly S = E / G experts per GPU (one replica each): for k = 0 .. S - 1, the k*G + 1 heaviest
    experts T cannot sit on G GPUs with at most k on each, so some GPU holds k + 1 of them, costing at
    least the sum of the k + 1 lightest of T. That GPU also holds S - k - 1 further experts, distinct
    from those k + 1: at least the S - k - 1 lightest experts outside T (there are E - k*G - 1 >=
    S - k - 1 of them, and each is no heavier than any expert of T, so no cheaper choice exists).
    (k = 0 is "the heaviest expert plus the S - 1 lightest".)"""
    c = as_counts(counts_LE)
    L, E = c.shape
    S = E // gpus
    s = -np.sort(-c, axis=1)
    light = np.concatenate([np.zeros((L, 1)), np.cumsum(s[:, ::-1], axis=1)], axis=1)   # sum of n lightest
    best = np.zeros(L)
    for k in range(S):
        top = s[:, k * gpus - k:k * gpus + 1].sum(1) if k else s[:, 0]
        best = np.maximum(best, top + light[:, S - k - 1])
    return np.maximum(1.0, _ratio(best, c.sum(1), gpus))


def cardinality_bound(counts_LE, gpus: int) -> np.ndarray:
    """R = 0 bound from the heaviest experts' companions [L].

    Proof. With exactly S = E / G experts per GPU (one replica each), fix k in 1 .. E and let j be the
    number of distinct GPUs holding the k heaviest experts; ceil(k / S) <= j <= min(k, G). Those j GPUs
    hold j*S experts: the k heaviest (total T_k) and j*S - k others, which are j*S - k distinct experts
    outside the k heaviest, so they weigh at least the j*S - k lightest experts, Light(j*S - k) (these
    are outside the top k because j*S - k <= E - k). The busiest GPU carries at least the mean of those
    j GPUs: max >= (T_k + Light(j*S - k)) / j. The layout decides j, so take the smallest value over
    the feasible j; every k gives a valid bound, so take the largest over k. k = 1 is "the heaviest plus
    the S - 1 lightest", k = E is the fractional W / G."""
    c = as_counts(counts_LE)
    L, E = c.shape
    S = E // gpus
    s = -np.sort(-c, axis=1)
    top = np.cumsum(s, axis=1)                                               # [L, E]: T_k at k - 1
    light = np.concatenate([np.zeros((L, 1)), np.cumsum(s[:, ::-1], axis=1)], axis=1)   # [L, E + 1]
    k = np.arange(1, E + 1)[:, None]                                         # [E, 1]
    j = np.arange(1, gpus + 1)[None, :]                                      # [1, G]
    ok = (j * S >= k) & (j <= k)                                             # [E, G]
    n = np.where(ok, j * S - k, 0)
    val = (top[:, :, None] + light[:, n]) / j                                # [L, E, G]
    best = np.where(ok, val, np.inf).min(2).max(1)
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
    group_LQ = c.reshape(L, groups, E // groups).sum(-1)
    per = groups // nodes
    total = c.sum(1)
    splits: list = []
    for part in _partitions(tuple(range(groups)), per):
        splits.append(part)
        if len(splits) > max_enum:
            splits = []  # too many to enumerate: the pigeonhole bound below
            break
    if splits:
        onehot = np.zeros((len(splits), nodes, groups))
        for q, part in enumerate(splits):
            for n, block in enumerate(part):
                onehot[q, n, list(block)] = 1.0
        node_LJM = np.einsum("lk,qnk->lqn", group_LQ, onehot)
        node_max_L = node_LJM.max(2).min(1)
    else:
        s = -np.sort(-group_LQ, axis=1)
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
        b = np.maximum(b, np.maximum(slot_bound(counts_LE, gpus), cardinality_bound(counts_LE, gpus)))
    return b

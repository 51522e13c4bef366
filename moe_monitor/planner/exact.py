"""Exact replica counts and packing for small layers: the minimum max GPU load under the planner's rules.

Rules: P = E + R slots, S = P / G on each of G GPUs, every expert at least one replica, no GPU holds two
replicas of one expert (so at most G replicas each). ``exact_layer`` is a branch and bound over replica counts
and packings: replica vectors are enumerated only where every replica stays below the best max load found so
far (the incumbent, e.g. the heuristic plan's), cheapest lower bound first; for each, a depth-first packing
(heaviest replica first; replicas of one expert in increasing GPU order; empty GPUs tried once) looks for a
packing below the incumbent, which then drops. Each success lowers the target, so this is a bisection on the max
load with a feasibility check whose steps are the loads found. When the search ends within ``budget`` nodes the
incumbent is the optimum (proven); otherwise the best packing found is returned, unproven.

Shapes: weight_E [E]; layout_P [P] (slot p on GPU p // S).
"""
from __future__ import annotations

from math import comb

import numpy as np

MAX_EXPERTS = 24       # layers with more experts are left to the heuristics (bounds only)
MAX_VECTORS = 20_000   # replica vectors below the incumbent tried per layer (more: the first ones, unproven)
BUDGET = 200_000       # search nodes per layer before giving up (unproven)
PLAN_BUDGET = 4_000_000  # search nodes and replica vectors per plan, all layers together (bounds the plan's time)
REL_EPS = 1e-9         # loads within this relative margin count as equal


def packing_bound(items: np.ndarray, gpus: int) -> float:
    """Lower bound on the max GPU load of fixed per-replica loads ``items`` [P] packed S = P / G per GPU:
    the mean, the heaviest item, and for k = 1 .. S - 1 the k*G + 1 heaviest items (some GPU holds k + 1 of
    them) with the S - k - 1 lightest items beside them."""
    q = np.sort(items)[::-1]
    P = q.size
    S = P // gpus
    best = max(float(q.sum()) / gpus, float(q[0]))
    light = np.concatenate([[0.0], np.cumsum(q[::-1])])
    for k in range(1, S):
        if k * gpus + 1 > P:
            break
        best = max(best, float(q[k * gpus - k:k * gpus + 1].sum()) + float(light[S - k - 1]))
    return best


def _replica_vectors(w: np.ndarray, slots: int, cap: int, below: float):
    """Replica vectors [E] (each 1..cap, summing to slots) whose heaviest replica w_e / r_e < below."""
    E = w.size
    low = np.maximum(1, np.floor(w / (below * (1 - REL_EPS))) + 1).astype(int)
    if (low > cap).any() or low.sum() > slots or cap * E < slots:
        return
    r = low.copy()

    def rec(e: int, left: int):
        if e == E - 1:
            if low[e] + left <= cap:
                r[e] = low[e] + left
                yield r.copy()
            return
        room_after = int((cap - low[e + 1:]).sum())
        for extra in range(max(0, left - room_after), min(left, cap - low[e]) + 1):
            r[e] = low[e] + extra
            yield from rec(e + 1, left - extra)
        r[e] = low[e]

    yield from rec(0, slots - int(low.sum()))


class _Search:
    """Depth-first packing below a target, counting nodes against a shared budget."""

    def __init__(self, gpus: int, per_gpu: int, budget: int):
        self.G, self.S, self.left = gpus, per_gpu, budget

    def pack(self, load: np.ndarray, expert: np.ndarray, target: float) -> np.ndarray | None:
        """GPU of every item [I] (items heaviest first) with every GPU load < target, or None (also when the
        budget runs out: check ``left``)."""
        G, S = self.G, self.S
        I = load.size
        gpu_load = [0.0] * G
        used = [0] * G
        holds: list[set[int]] = [set() for _ in range(G)]
        where = [-1] * I
        suffix = np.concatenate([np.cumsum(load[::-1])[::-1], [0.0]]).tolist()
        lim = target * (1 - REL_EPS)
        loads, experts = load.tolist(), expert.tolist()

        def rec(i: int) -> bool:
            if i == I:
                return True
            self.left -= 1
            if self.left < 0:
                return False
            room = sum(lim - gpu_load[g] for g in range(G) if used[g] < S)
            if suffix[i] > room + lim * REL_EPS:
                return False
            x, e = loads[i], experts[i]
            start = where[i - 1] + 1 if i and experts[i - 1] == e else 0
            tried_empty = False
            for g in range(start, G):
                if used[g] >= S or e in holds[g] or gpu_load[g] + x >= lim:
                    continue
                if used[g] == 0:
                    if tried_empty:
                        continue
                    tried_empty = True
                gpu_load[g] += x
                used[g] += 1
                holds[g].add(e)
                where[i] = g
                if rec(i + 1):
                    return True
                gpu_load[g] -= x
                used[g] -= 1
                holds[g].discard(e)
                if self.left < 0:
                    return False
            where[i] = -1
            return False

        return np.array(where) if rec(0) else None


def exact_layer(weight_E, gpus: int, redundant: int, incumbent: float | None = None, budget: int = BUDGET,
                max_vectors: int = MAX_VECTORS) -> tuple[np.ndarray | None, float, bool, int]:
    """(layout [P] or None when nothing beats ``incumbent``, its max GPU load (or the incumbent), proven
    optimal, work done: nodes + vectors) for one layer (module docstring). Without an incumbent the search
    starts from the total load."""
    w = np.asarray(weight_E, dtype=np.float64)
    E = w.size
    P = E + redundant
    S = P // gpus
    best = float(w.sum()) + 1.0 if incumbent is None else float(incumbent)
    best_layout = None
    search = _Search(gpus, S, budget)
    vectors: list[tuple[float, np.ndarray]] = []
    complete = True
    for r in _replica_vectors(w, P, min(gpus, P), best):
        if len(vectors) == max_vectors:
            complete = False
            break
        vectors.append((packing_bound(np.repeat(w / r, r), gpus), r))
    vectors.sort(key=lambda t: t[0])
    for lb, r in vectors:
        if lb >= best * (1 - REL_EPS):
            break
        ids = np.repeat(np.arange(E), r)
        per = (w / r)[ids]
        order = np.lexsort((ids, -per))
        while True:
            where = search.pack(per[order], ids[order], best)
            if where is None:
                break
            loads = np.bincount(where, weights=per[order], minlength=gpus)
            best = float(loads.max())
            gpu_of = np.empty(P, dtype=np.int64)
            gpu_of[order] = where
            best_layout = ids[np.argsort(gpu_of * P + np.arange(P), kind="stable")]
        if search.left < 0:
            return best_layout, best, False, budget + len(vectors)
    return best_layout, best, complete, budget - search.left + len(vectors)


def small_enough(num_experts: int, gpus: int, redundant: int) -> bool:
    """Whether exact_layer is tried on a layer of this shape (few experts, few ways to spread the spares)."""
    return num_experts <= MAX_EXPERTS and comb(num_experts + redundant - 1, max(redundant, 0)) <= MAX_VECTORS



SEARCH_GAP = 0.01      # a layer too large for the exact search is still searched when its gap is above this


def search_layers(counts_LE, layout_LP, gpus: int, redundant: int, gap_L,
                  plan_budget: int = PLAN_BUDGET) -> tuple[np.ndarray, np.ndarray]:
    """(layout [L, P] with every searched layer at its best packing found, the proven optimum max GPU load
    per layer [L], NaN where not proven). Searched, in layer order while ``plan_budget`` lasts: layers with
    traffic that are small_enough, or have at most MAX_EXPERTS experts and a gap to their bound above
    SEARCH_GAP (with a tenth of the vectors and budget); the layout's own max load is the incumbent, so a layer
    never gets worse."""
    c = np.asarray(counts_LE, dtype=np.float64)
    lay = np.array(layout_LP, dtype=np.int64)
    L, E = c.shape
    P = lay.shape[1]
    S = P // gpus
    optimum_L = np.full(L, np.nan)
    small = small_enough(E, gpus, redundant)
    if not small and E > MAX_EXPERTS:
        return lay, optimum_L
    left = plan_budget
    for layer in range(L):
        w = c[layer]
        if left <= 0:
            break
        if w.sum() <= 0 or not (small or gap_L[layer] > SEARCH_GAP):
            continue
        current = float(np.bincount(np.arange(P) // S, weights=w[lay[layer]] / np.bincount(
            lay[layer], minlength=E)[lay[layer]], minlength=gpus).max())
        share = 1 if small else 10
        found, best, proven, work = exact_layer(w, gpus, redundant, incumbent=current,
                                                budget=min(BUDGET // share, left), max_vectors=MAX_VECTORS // share)
        left -= work
        if found is not None:
            lay[layer] = found
        if proven:
            optimum_L[layer] = best
    return lay, optimum_L

"""Dispatch policies: how an engine shares an expert's tokens among its replicas, step by step; the load model's
second half (core.loadmodel holds the layout arithmetic). Every reader that turns counts into GPU loads under
a policy (pages, exporter, planner, advisor, score, diagnose) asks `DispatchModel`. docs/definitions.md.

- ``even``: count / replicas each; ``round_robin``: by token index, replica i of r gets floor(c / r) + (i < c mod r);
- ``lp``: per step and layer the split minimising the busiest GPU (the fractional optimum), by exact
  water-filling to the minimum-norm load vector, stopped within LP_TOLERANCE of a proven lower bound;
- ``ideal``: every GPU at the layer's mean (the bound of any policy).
Shapes: T steps, L layers, E experts, P slots, G GPUs, S = P / G, F replicated experts of a layer (<= F_MAX),
R the most GPUs one expert spans.
"""
from __future__ import annotations

import numpy as np

from .loadmodel import replica_counts, slot_weights, validated_layout

DISPATCH_POLICIES = ("even", "round_robin", "lp", "ideal")
LP_TOLERANCE = 1e-4     # relative gap (busiest GPU over the proven lower bound, minus 1) at which lp stops:
                        # 0.1 token at 1,000 tokens per GPU
LP_TOKEN_FLOOR = 0.01   # ... or within this many tokens of it (small counts)
CHUNK_BYTES = 64 << 20  # a reader solves at most this many bytes of [steps, L, P] float64 at once (steps_per_chunk)
TEMPORARIES = 6         # [steps, L, P] float64 arrays a slot_loads call holds at its peak (counts, shares, slots)
LP_MAX_SWEEPS = 400     # water-filling sweeps at most (sampled DeepSeek-V3 steps need up to ~120)


def check_policy(policy: str) -> str:
    """The policy name when it is one of DISPATCH_POLICIES; ValueError naming them otherwise."""
    if policy not in DISPATCH_POLICIES:
        raise ValueError(f"unknown dispatch policy {policy!r} (one of {', '.join(DISPATCH_POLICIES)})")
    return policy


class DispatchModel:
    """Slot and GPU loads of steps under one layout and one policy. Built once per layout; pure numpy.

    layout_LP: the physical_to_logical_map, int [L, P] (checked by core.loadmodel.validated_layout).
    """

    def __init__(self, layout_LP, num_experts: int, gpus: int, policy: str = "even"):
        self.policy = check_policy(policy)
        self.layout_LP = validated_layout(layout_LP, num_experts, gpus)
        self.num_experts, self.gpus = int(num_experts), int(gpus)
        L, P = self.layout_LP.shape
        self.slots_per_gpu = P // gpus
        self.gpu_P = np.arange(P) // self.slots_per_gpu
        self.replicas_LE = replica_counts(self.layout_LP, num_experts)
        if policy == "round_robin":
            self._rank_LP = _replica_rank(self.layout_LP)
        if policy == "lp":
            self._lp = _LpTables(self.layout_LP, self.gpu_P, num_experts, gpus)

    @property
    def steps_per_chunk(self) -> int:
        """Steps a reader hands slot_loads / gpu_loads at once so that the call's temporaries stay within
        CHUNK_BYTES (at least 1: 83 steps at 58 x 288, 1 step at 800 x 1000; lp costs the same in chunks)."""
        L, P = self.layout_LP.shape
        return max(1, CHUNK_BYTES // (L * max(P, self.num_experts) * 8 * TEMPORARIES))

    def slot_loads(self, counts_TLE) -> np.ndarray:
        """Tokens each slot serves, float64 [T, L, P], from counts [T, L, E] (numbers >= 0). Memory: about
        TEMPORARIES x T x L x P x 8 bytes at the peak (give at most steps_per_chunk steps at once)."""
        counts = _counts3(counts_TLE, self.layout_LP.shape[0], self.num_experts)
        if self.policy == "even":
            return slot_weights(counts, self.layout_LP)
        if self.policy == "round_robin":
            lay = np.broadcast_to(self.layout_LP, counts.shape[:2] + self.layout_LP.shape[1:])
            c = np.take_along_axis(counts, lay, axis=2)
            r = np.take_along_axis(np.broadcast_to(self.replicas_LE, counts.shape), lay, axis=2)
            base = np.floor(c / r)
            return base + (self._rank_LP < np.rint(c - base * r))
        if self.policy == "ideal":
            per_slot = counts.sum(axis=2, keepdims=True) / self.layout_LP.shape[1]
            return np.broadcast_to(per_slot, counts.shape[:2] + self.layout_LP.shape[1:]).copy()
        return self._lp.slot_loads(counts)

    def gpu_loads(self, counts_TLE) -> np.ndarray:
        """GPU loads float64 [T, L, G] from counts [T, L, E]."""
        slot_TLP = self.slot_loads(counts_TLE)
        return slot_TLP.reshape(slot_TLP.shape[:2] + (self.gpus, self.slots_per_gpu)).sum(-1)


def _counts3(counts_TLE, layers: int, num_experts: int) -> np.ndarray:
    counts = np.asarray(counts_TLE, dtype=np.float64)
    if counts.ndim != 3 or counts.shape[1:] != (layers, num_experts):
        raise ValueError(f"counts must be [steps, {layers}, {num_experts}] for this layout, got {counts.shape}")
    return counts


def _replica_rank(layout_LP: np.ndarray) -> np.ndarray:
    """int64 [L, P]: the position of each slot among its expert's slots, in slot order (0 for the first)."""
    L, P = layout_LP.shape
    order = np.argsort(layout_LP, axis=1, kind="stable")
    sorted_e = np.take_along_axis(layout_LP, order, axis=1)
    start = np.ones((L, P), dtype=bool)
    start[:, 1:] = sorted_e[:, 1:] != sorted_e[:, :-1]
    pos = np.arange(P)[None, :].repeat(L, axis=0)
    first = np.maximum.accumulate(np.where(start, pos, 0), axis=1)
    rank = np.empty((L, P), dtype=np.int64)
    np.put_along_axis(rank, order, pos - first, axis=1)
    return rank


class _LpTables:
    """The replicated experts of each layer, padded to [L, F_MAX, R]: their distinct GPUs (G = a padding GPU whose
    load stays +inf), how many of the expert's slots each holds, and the experts every other slot serves alone."""

    def __init__(self, layout_LP: np.ndarray, gpu_P: np.ndarray, num_experts: int, gpus: int):
        L, P = layout_LP.shape
        self.gpus = gpus
        spans: list[list[tuple[int, list[int], list[int]]]] = []  # per layer: (expert, gpus, slots per gpu)
        flexible_LE = np.zeros((L, num_experts), dtype=bool)
        for layer in range(L):
            found = []
            order = np.argsort(layout_LP[layer], kind="stable")
            experts, starts = np.unique(layout_LP[layer][order], return_index=True)
            bounds = list(starts[1:]) + [P]
            for expert, a, b in zip(experts, starts, bounds):
                if b - a < 2:
                    continue
                g, mult = np.unique(gpu_P[order[a:b]], return_counts=True)
                if g.size > 1:
                    found.append((int(expert), g.tolist(), mult.tolist()))
                    flexible_LE[layer, expert] = True
            spans.append(sorted(found, key=lambda item: len(item[1])))  # column f: similar spans in every layer
        self.flex_max = max((len(f) for f in spans), default=0)
        self.span_max = max((len(g) for f in spans for _, g, _ in f), default=1)
        F, R = self.flex_max, self.span_max
        self.expert_LF = np.zeros((L, F), dtype=np.int64)
        self.real_LF = np.zeros((L, F), dtype=bool)
        self.gpu_LFR = np.full((L, F, R), gpus, dtype=np.int64)
        self.mult_LFR = np.ones((L, F, R), dtype=np.float64)
        for layer, found in enumerate(spans):
            for f, (expert, span_gpus, span_mult) in enumerate(found):
                self.expert_LF[layer, f], self.real_LF[layer, f] = expert, True
                self.gpu_LFR[layer, f, :len(span_gpus)] = span_gpus
                self.mult_LFR[layer, f, :len(span_gpus)] = span_mult
        self.flexible_LE = flexible_LE
        self.span_F = (self.gpu_LFR < gpus).sum(-1).max(0) if F else np.zeros(0, dtype=np.int64)  # column widths
        self.layout_LP, self.gpu_P = layout_LP, gpu_P
        # slot -> index into the flattened [F * R] shares of its layer (flexible slots only)
        self.share_index_LP = np.zeros((L, P), dtype=np.int64)
        self.flexible_LP = np.take_along_axis(flexible_LE, layout_LP, axis=1)
        for layer, found in enumerate(spans):
            for f, (expert, span_gpus, _) in enumerate(found):
                for slot in np.flatnonzero(layout_LP[layer] == expert):
                    self.share_index_LP[layer, slot] = f * R + span_gpus.index(int(gpu_P[slot]))

    def slot_loads(self, counts_TLE: np.ndarray) -> np.ndarray:
        """float64 [T, L, P]: fixed experts' tokens split evenly over their slots (all on one GPU), replicated
        experts' tokens as the water-filling found them, split evenly over the expert's slots on each GPU."""
        slot_TLP = slot_weights(counts_TLE, self.layout_LP)
        if self.flex_max == 0:
            return slot_TLP
        T, L, P = slot_TLP.shape
        share_TLFR = self.solve(counts_TLE, slot_TLP)
        per_slot = (share_TLFR / self.mult_LFR).reshape(T, L, -1)
        flex = np.take_along_axis(per_slot, np.broadcast_to(self.share_index_LP, (T, L, P)), axis=2)
        return np.where(self.flexible_LP, flex, slot_TLP)

    def solve(self, counts_TLE: np.ndarray, slot_TLP: np.ndarray) -> np.ndarray:
        """Shares float64 [T, L, F, R] of each replicated expert's tokens per GPU at the lp optimum (the busiest
        GPU within LP_TOLERANCE of the proven lower bound). The (step, layer) pairs are solved as one batch of B
        pairs; a pair leaves the batch once proven."""
        T, L, P = slot_TLP.shape
        G, F, R = self.gpus, self.flex_max, self.span_max
        layer_B = np.broadcast_to(np.arange(L), (T, L)).ravel()
        fixed_BG = np.where(self.flexible_LP, 0.0, slot_TLP).reshape(T * L, G, -1).sum(-1)
        count_BF = np.take_along_axis(counts_TLE, np.broadcast_to(self.expert_LF, (T, L, F)), axis=2)
        count_BF = np.where(self.real_LF, count_BF, 0.0).reshape(T * L, F)
        gpu_BFR = self.gpu_LFR[layer_B]
        real_BFR = gpu_BFR < G
        share_out = np.where(real_BFR, (count_BF / np.maximum(real_BFR.sum(-1), 1))[..., None], 0.0)  # even start
        todo = np.flatnonzero(count_BF.sum(-1) > 0)                       # pairs with replicated tokens
        batch = _LpBatch(fixed_BG[todo], count_BF[todo], gpu_BFR[todo], share_out[todo], G, self.span_F)
        for sweep in range(LP_MAX_SWEEPS):
            batch.sweep(relax=1.0 if sweep < LP_PLAIN_SWEEPS else LP_RELAX)
            if sweep % 2 == 0 or sweep == LP_MAX_SWEEPS - 1:
                done = batch.gap() <= LP_TOLERANCE
                share_out[todo[done]] = batch.share[done]
                todo = todo[~done]
                batch = batch.subset(~done)
                if todo.size == 0:
                    break
        share_out[todo] = batch.share  # LP_MAX_SWEEPS reached: the best split found (never seen in the bench)
        return share_out.reshape(T, L, F, R)


LP_PLAIN_SWEEPS = 6     # plain water-filling sweeps before the over-relaxed ones
LP_RELAX = 1.5          # over-relaxation of the later sweeps (chains of replicated experts need ~2x fewer sweeps)


class _LpBatch:
    """B (step, layer) pairs of the lp problem: fixed GPU loads [B, G], replicated experts' tokens [B, F], their
    GPUs [B, F, R] (G: padding) and current shares [B, F, R]; load [B, G + 1] with column G at +inf."""

    def __init__(self, fixed_BG, count_BF, gpu_BFR, share_BFR, gpus: int, span_F: np.ndarray):
        self.fixed, self.count, self.gpu, self.share, self.gpus = fixed_BG, count_BF, gpu_BFR, share_BFR, gpus
        self.span_F = span_F
        self.load = np.empty((fixed_BG.shape[0], gpus + 1))
        real = gpu_BFR < gpus
        self.load[:, :gpus] = fixed_BG + _scatter_sum(share_BFR * real, np.where(real, gpu_BFR, 0), gpus)
        self.load[:, gpus] = np.inf

    def subset(self, keep_B: np.ndarray) -> _LpBatch:
        out = object.__new__(_LpBatch)
        out.fixed, out.count, out.gpu = self.fixed[keep_B], self.count[keep_B], self.gpu[keep_B]
        out.share, out.load, out.gpus = self.share[keep_B], self.load[keep_B], self.gpus
        out.span_F = self.span_F
        return out

    def sweep(self, relax: float) -> None:
        """One pass of exact water-filling, one replicated expert at a time (over-relaxed when relax > 1)."""
        flat = self.load.reshape(-1)
        rows = np.arange(self.load.shape[0])[:, None] * (self.gpus + 1)
        for f, span in enumerate(self.span_F):
            idx = rows + self.gpu[:, f, :span]
            old = self.share[:, f, :span]
            y = flat[idx] - old
            new = _waterfill(y, self.count[:, f])
            if relax != 1.0:
                new = _waterfill(np.where(np.isfinite(y), -(old + relax * (new - old)), np.inf), self.count[:, f])
            flat[idx] = y + new
            self.share[:, f, :span] = new
        self.load[:, self.gpus] = np.inf

    def gap(self) -> np.ndarray:
        """float64 [B]: the busiest GPU over a lower bound of the optimum, minus 1. The bound, valid for any GPU
        set U: (fixed load on U + tokens of the replicated experts whose GPUs all lie in U) / |U|, taken over the
        k busiest GPUs for k = 1..G."""
        G = self.gpus
        load_BG = self.load[:, :G]
        order = np.argsort(-load_BG, axis=1, kind="stable")
        position = np.empty_like(order)
        np.put_along_axis(position, order, np.broadcast_to(np.arange(G), order.shape), axis=1)
        real = self.gpu < G
        B, F, R = self.gpu.shape
        pos_BFR = np.take_along_axis(position, np.where(real, self.gpu, 0).reshape(B, F * R), axis=1)
        enters_BF = np.where(real, pos_BFR.reshape(B, F, R), 0).max(-1)   # the shortest prefix holding it all
        trapped_BG = _scatter_sum(self.count[..., None], enters_BF[..., None], G)
        fixed_sorted = np.take_along_axis(self.fixed, order, axis=1)
        lower = ((np.cumsum(fixed_sorted, axis=1) + np.cumsum(trapped_BG, axis=1)) / np.arange(1, G + 1)).max(-1)
        peak = load_BG.max(-1)
        close = peak - lower <= LP_TOKEN_FLOOR  # a hundredth of a token is exact enough for any count
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where((peak > 0) & ~close, peak / np.where(lower > 0, lower, 1.0) - 1.0, 0.0)


def _scatter_sum(values_BX: np.ndarray, gpu_BX: np.ndarray, gpus: int) -> np.ndarray:
    """float64 [B, G]: values [B, ...] summed onto their GPUs gpu [B, ...] (same shape), per pair."""
    B = values_BX.shape[0]
    gpu = np.broadcast_to(gpu_BX, values_BX.shape).reshape(B, -1)
    flat = (np.arange(B)[:, None] * gpus + gpu).ravel()
    return np.bincount(flat, weights=values_BX.reshape(B, -1).ravel(), minlength=B * gpus).reshape(B, gpus)


def _waterfill(y_BR: np.ndarray, c_B: np.ndarray) -> np.ndarray:
    """The split x [..., R] of c [...] tokens over bins of loads y [..., R] (+inf: no bin) that minimises the
    sum of squared loads y + x: x = max(0, level - y), sum x = c."""
    if y_BR.shape[-1] == 2:  # the common span (two replicas): closed form
        y0, y1 = y_BR[..., 0], y_BR[..., 1]
        with np.errstate(invalid="ignore"):
            x0 = np.where(np.isfinite(y1), np.clip((c_B + y1 - y0) / 2, 0.0, c_B), c_B)
        x0 = np.where(np.isfinite(y0), x0, 0.0)
        return np.stack([x0, np.where(np.isfinite(y1), c_B - x0, 0.0)], axis=-1)
    ys = np.sort(y_BR, axis=-1)
    k = np.arange(1, ys.shape[-1] + 1)
    with np.errstate(invalid="ignore"):
        level_k = (c_B[..., None] + np.cumsum(ys, axis=-1)) / k
        below = ys < level_k
    active = np.maximum(below.sum(-1), 1)
    level = np.take_along_axis(level_k, (active - 1)[..., None], axis=-1)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(y_BR), np.maximum(level - y_BR, 0.0), 0.0)

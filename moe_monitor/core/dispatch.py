"""Dispatch policies: how an engine shares an expert's tokens among its replicas, step by step; the load model's
second half (core.loadmodel holds the layout arithmetic). Every reader that turns counts into GPU loads under
a policy (pages, exporter, planner, advisor, score, diagnose) asks `DispatchModel`. docs/definitions.md.

- ``even``: count / replicas each; ``round_robin``: by token index, replica i of r gets floor(c / r) + (i < c mod r);
- ``lp``: per step and layer the split minimising the busiest GPU (the fractional optimum): the minimum-norm load
  vector, solved exactly (core.lpsplit);
- ``ideal``: every GPU at the layer's mean (the bound of any policy).
Shapes: T steps, L layers, E experts, P slots, G GPUs, S = P / G, F replicated experts of a layer (<= F_MAX),
R the most GPUs one expert spans. A slot holding -1 (vLLM's unused slot) serves nothing under every policy but
``ideal`` (which spreads the layer's tokens over all slots: every GPU at the mean).
"""
from __future__ import annotations

import numpy as np

from .keys import DISPATCH_POLICIES
from .loadmodel import gpu_loads, replica_counts, slot_weights, validated_layout
from .lpsplit import LpSplit, layer_products

CHUNK_BYTES = 64 << 20  # a reader solves at most this many bytes of [steps, L, P] float64 at once (steps_per_chunk)
TEMPORARIES = 6         # [steps, L, P] float64 arrays a slot_loads call holds at its peak (counts, shares, slots)


def check_policy(policy: str) -> str:
    """The policy name when it is one of DISPATCH_POLICIES; ValueError naming them otherwise."""
    if policy not in DISPATCH_POLICIES:
        raise ValueError(f"unknown dispatch policy {policy!r} (one of {', '.join(DISPATCH_POLICIES)})")
    return policy


class DispatchModel:
    """Slot and GPU loads of steps under one layout and one policy. Built once per layout; pure numpy.

    layout_LP: the physical_to_logical_map, int [L, P] (checked by core.loadmodel.validated_layout; -1: an
    unused slot).
    """

    def __init__(self, layout_LP, num_experts: int, gpus: int, policy: str = "even"):
        self.policy = check_policy(policy)
        self.layout_LP = validated_layout(layout_LP, num_experts, gpus, unused=True)
        self.unused_LP = self.layout_LP < 0
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
            lay = np.broadcast_to(np.maximum(self.layout_LP, 0), counts.shape[:2] + self.layout_LP.shape[1:])
            c = np.take_along_axis(counts, lay, axis=2)
            r = np.take_along_axis(np.broadcast_to(self.replicas_LE, counts.shape), lay, axis=2)
            base = np.floor(c / r)
            slot_TLP = base + (self._rank_LP < np.rint(c - base * r))
            slot_TLP[:, self.unused_LP] = 0.0
            return slot_TLP
        if self.policy == "ideal":
            per_slot = counts.sum(axis=2, keepdims=True) / self.layout_LP.shape[1]
            return np.broadcast_to(per_slot, counts.shape[:2] + self.layout_LP.shape[1:]).copy()
        return self._lp.slot_loads(counts)

    def gpu_loads(self, counts_TLE) -> np.ndarray:
        """GPU loads float64 [T, L, G] from counts [T, L, E]."""
        if self.policy == "lp":
            return self._lp.gpu_loads(_counts3(counts_TLE, self.layout_LP.shape[0], self.num_experts))
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
    """The replicated experts of each layer, padded to [L, F_MAX, R]: their distinct GPUs (G = padding), how many
    of the expert's slots each holds, and the slots they serve (the columns core.lpsplit answers)."""

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
                if b - a < 2 or expert < 0:  # one slot, or the unused slots (-1)
                    continue
                g, mult = np.unique(gpu_P[order[a:b]], return_counts=True)
                if g.size > 1:
                    found.append((int(expert), g.tolist(), mult.tolist()))
                    flexible_LE[layer, expert] = True
            spans.append(found)
        self.flex_max = max((len(f) for f in spans), default=0)
        self.span_max = max((len(g) for f in spans for _, g, _ in f), default=1)
        F, R = self.flex_max, self.span_max
        self.expert_LF = np.zeros((L, F), dtype=np.int64)
        self.real_LF = np.zeros((L, F), dtype=bool)
        gpu_LFR = np.full((L, F, R), gpus, dtype=np.int64)
        self.layout_LP, self.gpu_P = layout_LP, gpu_P
        self.flexible_LP = np.take_along_axis(flexible_LE, np.maximum(layout_LP, 0), axis=1) & (layout_LP >= 0)
        self.slots_L = [np.flatnonzero(row) for row in self.flexible_LP]   # the flexible slots, the columns
        Q = max((s.size for s in self.slots_L), default=0)
        column_LQ, weight_LQ = np.zeros((L, Q), dtype=np.int64), np.zeros((L, Q))
        for layer, found in enumerate(spans):
            share_of: dict[tuple[int, int], tuple[int, float]] = {}   # (expert, GPU) -> (share, slot's part)
            for f, (expert, span_gpus, span_mult) in enumerate(found):
                self.expert_LF[layer, f], self.real_LF[layer, f] = expert, True
                gpu_LFR[layer, f, :len(span_gpus)] = span_gpus
                for r, (on_gpu, slots_there) in enumerate(zip(span_gpus, span_mult)):
                    share_of[expert, on_gpu] = (f * R + r, 1.0 / slots_there)
            for q, slot in enumerate(self.slots_L[layer]):
                column_LQ[layer, q], weight_LQ[layer, q] = share_of[int(layout_LP[layer, slot]), int(gpu_P[slot])]
        # counts [E] -> the split's inputs: each fixed expert's tokens onto its GPU, then the replicated experts'
        self.input_map_LEK = np.zeros((L, num_experts, gpus + F))
        for layer in range(L):
            fixed = ~self.flexible_LP[layer] & (layout_LP[layer] >= 0)
            self.input_map_LEK[layer, layout_LP[layer][fixed], gpu_P[fixed]] = 1.0
            self.input_map_LEK[layer, self.expert_LF[layer], gpus + np.arange(F)] = self.real_LF[layer]
        if F:
            self.split = LpSplit(gpu_LFR, gpus, column_LQ, weight_LQ)

    def slot_loads(self, counts_TLE: np.ndarray) -> np.ndarray:
        """float64 [T, L, P]: fixed experts' tokens split evenly over their slots (all on one GPU), replicated
        experts' tokens as core.lpsplit splits them over GPUs, evenly over the expert's slots on each GPU."""
        slot_TLP = slot_weights(counts_TLE, self.layout_LP)
        if self.flex_max == 0:
            return slot_TLP
        column_LTQ = self.split.columns(self._inputs(counts_TLE))
        for layer, slots in enumerate(self.slots_L):
            slot_TLP[:, layer, slots] = column_LTQ[layer, :, :slots.size]
        return slot_TLP

    def gpu_loads(self, counts_TLE: np.ndarray) -> np.ndarray:
        """float64 [T, L, G]: the GPU loads of slot_loads, without the slots."""
        if self.flex_max == 0:
            return gpu_loads(counts_TLE, self.layout_LP, self.gpus)
        return self.split.loads(self._inputs(counts_TLE)).transpose(1, 0, 2).copy()

    def _inputs(self, counts_TLE: np.ndarray) -> np.ndarray:
        """float64 [L, T, G + F]: the fixed GPU loads (the fixed experts' tokens), then the replicated experts'."""
        return layer_products(np.ascontiguousarray(counts_TLE.transpose(1, 0, 2)), self.input_map_LEK)

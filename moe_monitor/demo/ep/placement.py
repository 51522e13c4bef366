"""A layout over the ranks of an EP group: which rank holds which expert, and which replica a token goes to.

Shape legend (README, Conventions): L MoE layers, E logical experts, P physical slots (slot p on rank
p // S, S = P / G), G ranks (GPUs), N tokens, K top-k.

Replica choice (deterministic, even, no communication): the k-th expert e of token n, with c_e replicas in slot
order r_0 < r_1 < ..., goes to replica r_(n mod c_e): the even split the dashboard and the planner assume. The
routing table is O(L x (P + E)): each layer's slots sorted by expert (stable), with each expert's first position
and replica count; replica r of e is the slot at position first[e] + r (docs/ep-runtime.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from moe_monitor import core


class Placement:
    """layout_LP int [L, P] over `ranks` ranks (-1: a slot that holds no expert); ValueError unless every expert
    0..E-1 has a slot in every layer and P is a multiple of ranks."""

    def __init__(self, layout_LP, ranks: int, num_experts: int):
        layout = core.check_layout_map(layout_LP, ranks, 1, len(layout_LP), num_experts, unused=True)
        self.layout_LP = np.asarray(layout, dtype=np.int64)
        self.ranks, self.num_experts = ranks, num_experts
        self.num_layers, self.num_slots = self.layout_LP.shape
        self.slots_per_rank = self.num_slots // ranks
        expert_LP = np.where(self.layout_LP < 0, num_experts, self.layout_LP)  # unused slots sort last
        by_expert_LP = np.argsort(expert_LP, axis=1, kind="stable")  # slot ids, expert-major, slot order
        count_LE = np.stack([np.bincount(row, minlength=num_experts + 1)[:num_experts] for row in expert_LP])
        first_LE = np.cumsum(count_LE, axis=1) - count_LE
        self.replica_count_LE = torch.from_numpy(count_LE.astype(np.int64))
        self.replica_first_LE = torch.from_numpy(first_LE.astype(np.int64))
        self.replica_rank_LP = torch.from_numpy(by_expert_LP // self.slots_per_rank)

    def table_bytes(self) -> int:
        """Bytes of the routing table (the replica counts, first positions and ranks): O(L x (P + E))."""
        return sum(t.numel() * t.element_size()
                   for t in (self.replica_count_LE, self.replica_first_LE, self.replica_rank_LP))

    def experts_on(self, rank: int, layer: int) -> list[int]:
        """Sorted distinct experts rank holds in layer."""
        s = self.slots_per_rank
        return sorted({int(e) for e in self.layout_LP[layer, rank * s:(rank + 1) * s] if e >= 0})

    def holders(self, layer: int, expert: int) -> list[int]:
        """Sorted distinct ranks holding expert in layer."""
        slots = np.flatnonzero(self.layout_LP[layer] == expert)
        return sorted({int(p) // self.slots_per_rank for p in slots})

    def destinations(self, layer: int, ids_NK: torch.Tensor) -> torch.Tensor:
        """int64 [N * K]: the rank each (token, k) pair goes to, pairs flattened token-major (module docstring)."""
        n, k = ids_NK.shape
        ids_M = ids_NK.reshape(-1).to(torch.int64)
        token_M = torch.arange(n, dtype=torch.int64).repeat_interleave(k)
        replica_M = token_M % self.replica_count_LE[layer][ids_M]
        return self.replica_rank_LP[layer][self.replica_first_LE[layer][ids_M] + replica_M]


@dataclass(frozen=True)
class Move:
    """One expert's weights of one layer copied from rank src to rank dst (dst did not hold it)."""

    layer: int
    expert: int
    src: int
    dst: int


def plan_moves(old: Placement, new: Placement) -> list[Move]:
    """The copies that take the ranks from old to new: for every rank, every expert the new layout puts on it
    that it does not hold now, from one of its current holders (spread: holder (dst + layer + expert) mod the
    holder count). Same list, same order, on every rank."""
    if (old.num_layers, old.ranks, old.num_experts) != (new.num_layers, new.ranks, new.num_experts):
        raise ValueError("the new layout must have the same layers, ranks and experts as the current one")
    moves = []
    for layer in range(new.num_layers):
        for dst in range(new.ranks):
            held = set(old.experts_on(dst, layer))
            for expert in new.experts_on(dst, layer):
                if expert not in held:
                    holders = old.holders(layer, expert)
                    moves.append(Move(layer, expert, holders[(dst + layer + expert) % len(holders)], dst))
    return moves

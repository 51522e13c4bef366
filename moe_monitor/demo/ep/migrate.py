"""Moving expert weights between ranks for a new layout: point-to-point isend / irecv of packed weights, only
the experts a rank does not hold yet (placement.plan_moves), then each rank keeps what the new layout puts on
it."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .placement import Placement, plan_moves
from .store import ExpertStore


@dataclass(frozen=True)
class MigrationStats:
    """moves: expert copies in the whole group (one expert of one layer onto a rank that lacked it);
    received / sent: this rank's; bytes_moved: the whole group's weight bytes; seconds: this rank's wall time."""

    moves: int
    received: int
    sent: int
    bytes_moved: int
    seconds: float


def migrate(store: ExpertStore, old: Placement, new: Placement, rank: int) -> tuple[ExpertStore, MigrationStats]:
    """Every rank calls this at the same step with the same placements. Returns the store for the new layout."""


    started = time.perf_counter()
    moves = plan_moves(old, new)
    floats = store.floats_per_expert
    dtype = next(iter(w for layer in store.weights_L for w in layer.values()))[0].dtype
    requests, inbox = [], {}
    for tag, move in enumerate(moves):
        if move.dst == rank:
            buf = torch.empty(floats, dtype=dtype)
            inbox[(move.layer, move.expert)] = buf
            requests.append(dist.irecv(buf, src=move.src, tag=tag))
        elif move.src == rank:
            requests.append(dist.isend(store.pack(move.layer, move.expert), dst=move.dst, tag=tag))
    for request in requests:
        request.wait()
    weights_L = []
    for layer in range(new.num_layers):
        held = {}
        for expert in new.experts_on(rank, layer):
            if (layer, expert) in inbox:
                held[expert] = store.unpack(inbox[(layer, expert)])
            else:
                held[expert] = store.weights_L[layer][expert]
        weights_L.append(held)
    stats = MigrationStats(moves=len(moves), received=len(inbox), sent=sum(m.src == rank for m in moves),
                           bytes_moved=len(moves) * floats * dtype.itemsize if moves else 0,
                           seconds=time.perf_counter() - started)
    return ExpertStore(weights_L, store.hidden_size, store.ffn_size), stats

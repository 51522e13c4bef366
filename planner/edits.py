"""Click-to-edit: pure functions that return a NEW read-only layout; undo = keep the old one.

A GPU has exactly S slots, so edits replace or swap slots; they never grow a GPU. Every result keeps
each expert >= 1 replica and never puts two replicas of one expert on one GPU (else ValueError).
Shapes: layout_LP [L, P] (slot p on GPU p // S), counts_LE [L, E]; ``layer`` picks the row edited.
History helpers: ``push(history, layout)`` and ``undo(history)`` on a tuple of layouts.
"""
from __future__ import annotations

import numpy as np

from .loads import replica_counts


def _prep(layout_LP, counts_LE, layer: int, gpus: int):
    lay = np.array(layout_LP, dtype=np.int64)
    if lay.ndim != 2:
        raise ValueError(f"layout must be [layers, slots], got shape {lay.shape}")
    if not 0 <= layer < lay.shape[0]:
        raise ValueError(f"layer {layer} out of range 0..{lay.shape[0] - 1}")
    if gpus < 1 or lay.shape[1] % gpus:
        raise ValueError(f"{lay.shape[1]} slots do not split over {gpus} GPUs")
    c = np.asarray(counts_LE, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != lay.shape[0]:
        raise ValueError(f"counts must be [layers, experts] with {lay.shape[0]} layers, got {c.shape}")
    return lay, c, lay.shape[1] // gpus


def _check(e: int, E: int, g: int, gpus: int, what: str = "GPU"):
    if not 0 <= e < E:
        raise ValueError(f"expert {e} out of range 0..{E - 1}")
    if not 0 <= g < gpus:
        raise ValueError(f"{what} {g} out of range 0..{gpus - 1}")


def _frozen(lay: np.ndarray) -> np.ndarray:
    lay.setflags(write=False)
    return lay


def add_replica(layout_LP, counts_LE, layer: int, expert: int, gpu: int, gpus: int) -> np.ndarray:
    """Put one more replica of ``expert`` on ``gpu``: it replaces the slot on that GPU whose expert keeps
    >= 1 replica elsewhere and has the lowest per-replica load (count / replicas)."""
    lay, c, S = _prep(layout_LP, counts_LE, layer, gpus)
    E = c.shape[1]
    _check(expert, E, gpu, gpus)
    row = lay[layer]
    slots = np.arange(gpu * S, (gpu + 1) * S)
    if np.any(row[slots] == expert):
        raise ValueError(f"GPU {gpu} already holds expert {expert}")
    rep = replica_counts(row[None], E)[0]
    cand = slots[rep[row[slots]] >= 2]
    if cand.size == 0:
        raise ValueError(f"every slot on GPU {gpu} holds the only replica of its expert; "
                         "nothing can be replaced")
    value = c[layer, row[cand]] / rep[row[cand]]
    lay[layer, cand[np.argmin(value)]] = expert
    return _frozen(lay)


def move_replica(layout_LP, counts_LE, layer: int, expert: int, src_gpu: int, dst_gpu: int, gpus: int,
                 swap_slot: int | None = None) -> np.ndarray:
    """Move ``expert``'s replica from ``src_gpu`` to ``dst_gpu`` by swapping it with a slot there:
    ``swap_slot`` (a global slot index on dst_gpu) or else the dst slot with the lowest per-replica load
    whose expert is not already on src_gpu."""
    lay, c, S = _prep(layout_LP, counts_LE, layer, gpus)
    E = c.shape[1]
    _check(expert, E, src_gpu, gpus, "source GPU")
    _check(expert, E, dst_gpu, gpus, "destination GPU")
    if src_gpu == dst_gpu:
        raise ValueError("source and destination GPU are the same")
    row = lay[layer]
    src = np.arange(src_gpu * S, (src_gpu + 1) * S)
    dst = np.arange(dst_gpu * S, (dst_gpu + 1) * S)
    hit = src[row[src] == expert]
    if hit.size == 0:
        raise ValueError(f"GPU {src_gpu} holds no replica of expert {expert}")
    if np.any(row[dst] == expert):
        raise ValueError(f"GPU {dst_gpu} already holds expert {expert}")
    ok = dst[~np.isin(row[dst], row[src])]
    if swap_slot is not None:
        if swap_slot not in dst:
            raise ValueError(f"slot {swap_slot} is not on GPU {dst_gpu}")
        if swap_slot not in ok:
            raise ValueError(f"slot {swap_slot} holds expert {row[swap_slot]}, already on GPU {src_gpu}")
        j = swap_slot
    else:
        if ok.size == 0:
            raise ValueError(f"every expert on GPU {dst_gpu} is already on GPU {src_gpu}; no swap possible")
        rep = replica_counts(row[None], E)[0]
        j = ok[np.argmin(c[layer, row[ok]] / rep[row[ok]])]
    i = hit[0]
    lay[layer, i], lay[layer, j] = row[j], row[i]
    return _frozen(lay)


def push(history: tuple, layout_LP) -> tuple:
    """New history with ``layout_LP`` appended (the newest is last)."""
    return tuple(history) + (layout_LP,)


def undo(history: tuple) -> tuple[tuple, np.ndarray]:
    """(shorter history, layout now current) after undoing the newest edit."""
    if len(history) < 2:
        raise ValueError("nothing to undo")
    h = tuple(history)[:-1]
    return h, h[-1]

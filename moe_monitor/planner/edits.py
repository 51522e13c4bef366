"""Click-to-edit: pure functions that return a NEW read-only layout and leave their input as it was (the
What-if page's edit session, dashboard.whatif.edits, keeps the history and undoes by going back to it).

A GPU has exactly S slots, so edits replace or swap slots; they never grow a GPU. Every result keeps
each expert >= 1 replica and never puts two replicas of one expert on one GPU (else ValueError).
Shape legend (README, Conventions): L layers, E logical experts, P slots, G GPUs, S slots per GPU.
layout_LP [L, P] (slot p on GPU p // S), counts_LE [L, E]; ``layer`` picks the row edited.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from moe_monitor.core.loadmodel import replica_counts


def _checked_copy(layout_LP: ArrayLike, counts_LE: ArrayLike, layer: int, gpus: int
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """(a writable int64 copy of the layout, counts as float64, S slots per GPU), or ValueError."""
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


def _check_expert_and_gpu(e: int, E: int, g: int, gpus: int, what: str = "GPU") -> None:
    if not 0 <= e < E:
        raise ValueError(f"expert {e} out of range 0..{E - 1}")
    if not 0 <= g < gpus:
        raise ValueError(f"{what} {g} out of range 0..{gpus - 1}")


def _read_only(lay: np.ndarray) -> np.ndarray:
    lay.setflags(write=False)
    return lay


def add_replica(layout_LP: ArrayLike, counts_LE: ArrayLike, layer: int, expert: int, gpu: int, gpus: int
                ) -> np.ndarray:
    """Put one more replica of ``expert`` on ``gpu``: it replaces the slot on that GPU whose expert keeps
    >= 1 replica elsewhere and has the lowest per-replica load (count / replicas)."""
    lay, c, S = _checked_copy(layout_LP, counts_LE, layer, gpus)
    E = c.shape[1]
    _check_expert_and_gpu(expert, E, gpu, gpus)
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
    return _read_only(lay)


def move_replica(layout_LP: ArrayLike, counts_LE: ArrayLike, layer: int, expert: int, src_gpu: int, dst_gpu: int,
                 gpus: int) -> np.ndarray:
    """Move ``expert``'s replica from ``src_gpu`` to ``dst_gpu`` by swapping it with the slot on dst_gpu with
    the lowest per-replica load whose expert is not already on src_gpu."""
    lay, c, S = _checked_copy(layout_LP, counts_LE, layer, gpus)
    E = c.shape[1]
    _check_expert_and_gpu(expert, E, src_gpu, gpus, "source GPU")
    _check_expert_and_gpu(expert, E, dst_gpu, gpus, "destination GPU")
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
    if ok.size == 0:
        raise ValueError(f"every expert on GPU {dst_gpu} is already on GPU {src_gpu}; no swap possible")
    rep = replica_counts(row[None], E)[0]
    j = ok[np.argmin(c[layer, row[ok]] / rep[row[ok]])]
    i = hit[0]
    lay[layer, i], lay[layer, j] = row[j], row[i]
    return _read_only(lay)

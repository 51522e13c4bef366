"""GPU load from expert counts under a layout, with the even-split rule.

GPU load of a step and layer = sum over the GPU's slots p of count[e_p] / replicas[e_p] (a token routed to an
expert with r replicas is assumed to be split evenly across them, as EPLB assumes).

Shape legend: T steps, L layers, E logical experts, P physical slots, G GPUs.
"""
from __future__ import annotations

import numpy as np


def layout_array(physical_to_logical_map, num_experts: int, gpus: int) -> np.ndarray:
    """physical_to_logical_map [L][P] (lists or array) -> int64 array [L, P], checked.

    Raises ValueError when a slot names an expert outside [0, E), an expert has no slot, or P does not
    split evenly over `gpus`."""
    try:
        p2l_LP = np.asarray(physical_to_logical_map, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"physical_to_logical_map must be a rectangular [layers][slots] integer list: {exc}") from None
    if p2l_LP.ndim != 2 or p2l_LP.shape[1] == 0:
        raise ValueError(f"physical_to_logical_map must be [layers][slots], got shape {p2l_LP.shape}")
    if gpus < 1 or p2l_LP.shape[1] % gpus:
        raise ValueError(f"{p2l_LP.shape[1]} slots per layer do not split evenly over {gpus} GPUs")
    if p2l_LP.min() < 0 or p2l_LP.max() >= num_experts:
        raise ValueError(f"physical_to_logical_map names experts outside 0..{num_experts - 1}")
    replicas_LE = replica_counts(p2l_LP, num_experts)
    missing = np.argwhere(replicas_LE == 0)
    if len(missing):
        layer, expert = missing[0]
        raise ValueError(f"layer {layer}: expert {expert} has no slot in the layout")
    return p2l_LP


def replica_counts(p2l_LP: np.ndarray, num_experts: int) -> np.ndarray:
    """int64 [L, E]: how many slots hold each logical expert in each layer."""
    num_layers = p2l_LP.shape[0]
    replicas_LE = np.zeros((num_layers, num_experts), dtype=np.int64)
    np.add.at(replicas_LE, (np.repeat(np.arange(num_layers), p2l_LP.shape[1]), p2l_LP.ravel()), 1)
    return replicas_LE


def gpu_weights(p2l_LP: np.ndarray, num_experts: int, gpus: int) -> np.ndarray:
    """float32 [L, E, G]: share of expert e's tokens that GPU g serves in layer l (even split over replicas).

    Every (l, e) row sums to 1, so total load is conserved."""
    p2l_LP = layout_array(p2l_LP, num_experts, gpus)
    num_layers, num_slots = p2l_LP.shape
    slots_per_gpu = num_slots // gpus
    replicas_LE = replica_counts(p2l_LP, num_experts)
    weights_LEG = np.zeros((num_layers, num_experts, gpus), dtype=np.float64)
    layer_LP = np.repeat(np.arange(num_layers), num_slots).reshape(num_layers, num_slots)
    gpu_LP = np.broadcast_to(np.arange(num_slots) // slots_per_gpu, (num_layers, num_slots))
    share_LP = 1.0 / np.take_along_axis(replicas_LE, p2l_LP, axis=1)
    np.add.at(weights_LEG, (layer_LP.ravel(), p2l_LP.ravel(), gpu_LP.ravel()), share_LP.ravel())
    return weights_LEG.astype(np.float32)


def gpu_loads(counts_TLE: np.ndarray, weights_LEG: np.ndarray) -> np.ndarray:
    """float32 [T, L, G] GPU loads (tokens) of each step and layer.

    counts_TLE: tokens per logical expert (any integer dtype); weights_LEG from gpu_weights()."""
    counts_TLE = np.asarray(counts_TLE)
    if counts_TLE.ndim != 3:
        raise ValueError(f"counts must be [steps, layers, experts], got shape {counts_TLE.shape}")
    if counts_TLE.shape[1:] != weights_LEG.shape[:2]:
        raise ValueError(f"counts are [L, E] = {counts_TLE.shape[1:]}, the layout is for {weights_LEG.shape[:2]}")
    counts_LTE = counts_TLE.astype(np.float32).transpose(1, 0, 2)
    loads_LTG = np.matmul(counts_LTE, weights_LEG)
    return np.ascontiguousarray(loads_LTG.transpose(1, 0, 2))

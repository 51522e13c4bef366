"""The planner's own limits and checks on top of the load model (core.loadmodel: GPU loads under a layout,
balancedness; core.counts: the counts check): how large a plan may grow, whole-number flags, and the rule that
no GPU holds two replicas of one expert.

Shape legend (README, Conventions): L layers, E logical experts, P = E + R physical slots, G GPUs,
S = P // G slots per GPU, T steps.
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.counts import short_repr
from moe_monitor.core.loadmodel import gpu_loads, imbalance, validated_layout

MAX_SLOTS = 65536            # P = E + R: physical slots per layer the planner takes
MAX_PLAN_CELLS = 1 << 25     # L x (scenarios x S x P + G x E): the planner's working tables (see check_size)
CHUNK_STEPS = 512  # steps scored at once by the replaying tools (bounds their [steps, L, P] temporaries)


def whole_number(value, name: str, minimum: int | None = None) -> int:
    """value as an int (numpy integers welcome, bools not), at least `minimum` when given; ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a whole number, got {short_repr(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {short_repr(value)}")
    return int(value)


def check_shape(num_experts: int, gpus: int, redundant: int) -> int:
    """Check E, G, R fit together and return S, the slots per GPU."""
    gpus, redundant = whole_number(gpus, "--gpus"), whole_number(redundant, "--redundant")
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if redundant < 0:
        raise ValueError(f"--redundant must be >= 0, got {redundant}")
    slots = num_experts + redundant
    if slots > MAX_SLOTS:
        raise ValueError(f"experts + redundant = {num_experts} + {redundant} = {slots} slots per layer, above the "
                         f"planner's limit of {MAX_SLOTS}")
    if slots % gpus:
        raise ValueError(f"experts + redundant = {num_experts} + {redundant} = {slots} slots do not split "
                         f"evenly over {gpus} GPUs; pick R so that (E + R) is a multiple of G")
    per_gpu = slots // gpus
    if redundant > 0 and per_gpu > num_experts:
        raise ValueError(f"{per_gpu} slots per GPU exceed the {num_experts} experts: some GPU would hold "
                         "two replicas of one expert")
    return per_gpu


def check_size(layers: int, num_experts: int, gpus: int, slots: int, scenarios: int = 1) -> None:
    """ValueError when a plan of L layers, E experts and P slots on G GPUs would outgrow the planner's working
    tables: P must stay within MAX_SLOTS; the swap search holds scenarios x S x P candidates per layer
    (S = P / G slots per GPU, scenarios = the windows balanced at once, 1 for [L, E] counts), the bounds and the
    packing G x E per layer: L x (scenarios x S x P + G x E) must stay within MAX_PLAN_CELLS (2**25, about
    1.5 GiB of working memory at the peak)."""
    if slots > MAX_SLOTS:
        raise ValueError(f"{slots} slots per layer, above the planner's limit of {MAX_SLOTS}")
    per_gpu = slots // gpus
    cells = layers * (scenarios * per_gpu * slots + gpus * num_experts)
    if cells > MAX_PLAN_CELLS:
        raise ValueError(f"plan too large: {layers} layers x ({scenarios} window(s) x {per_gpu} slots per GPU x "
                         f"{slots} slots + {gpus} GPUs x {num_experts} experts) = {cells:,} cells, above the "
                         f"planner's limit of {MAX_PLAN_CELLS:,} (about 1.5 GiB of working memory); plan fewer "
                         "layers, windows (--recent) or slots")


def layer_imbalance(counts_LE, layout_LP, gpus: int) -> np.ndarray:
    """Per-layer max/mean GPU load of a layout on given counts, [L] (or [T, L]); 1.0 for a layer without
    tokens (a dense layer is perfectly balanced in the planner's sums)."""
    return np.nan_to_num(imbalance(gpu_loads(counts_LE, layout_LP, gpus)), nan=1.0)


def check_layout(layout_LP, num_experts: int, gpus: int) -> np.ndarray:
    """validated_layout() plus the planner's own rule: no expert twice on one GPU. Returns int64 [L, P]."""
    lay = validated_layout(layout_LP, num_experts, gpus)
    dup_L = duplicates_on_gpu(lay, gpus)
    if dup_L.any():
        raise ValueError(f"layer {int(np.argmax(dup_L))}: some GPU holds two replicas of one expert")
    return lay


def duplicates_on_gpu(layout_LP: np.ndarray, gpus: int) -> np.ndarray:
    """Bool [L]: True where some GPU holds two replicas of the same expert."""
    L, P = layout_LP.shape
    s = np.sort(layout_LP.reshape(L, gpus, P // gpus), axis=-1)
    return (np.diff(s, axis=-1) == 0).any(axis=(1, 2))

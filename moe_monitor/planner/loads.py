"""Shared helpers: input checks, replica counts and GPU loads under a layout.

Shape legend (README, Conventions): L layers, E logical experts, P = E + R physical slots, G GPUs,
S = P // G slots per GPU, T steps, W windows, X any leading axes. A layout is ``layout_LP[l, p]`` = logical
expert held by slot p (SGLang's ``physical_to_logical_map``); slot p lives on GPU ``p // S``.
GPU load = sum over the GPU's slots of count[e] / replicas[e] (tokens split evenly across replicas,
as EPLB assumes). This module is the one implementation of that rule and of eta = mean/max for the whole
dashboard: ``gpu_loads`` (slot form, the planner's hot path) and ``gpu_weights`` + ``weighted_loads`` (matmul
form, many steps under one layout) give the same loads; ``balancedness_or_nan`` is NaN for an idle layer.
"""
from __future__ import annotations

import numpy as np

MAX_SLOTS = 65536            # P = E + R: physical slots per layer the planner takes
MAX_PLAN_CELLS = 1 << 25     # L x (scenarios x S x P + G x E): the planner's working tables (see check_size)
MAX_COUNT_SUM = 1e30         # all counts together: sums and the float32 screens (max 3.4e38) stay finite
MIN_ROW_SUM = 1e-30          # a layer's (window's) counts: 0 or at least this (tinier means underflow)
_MAX_NEST = 3                # [windows][layers][experts]


def _numbers_only(obj, name: str) -> None:
    """ValueError unless obj is numbers (int or float, never bool or str) nested at most _MAX_NEST lists deep,
    or numeric numpy arrays. Walks lists iteratively; the message names the first offender's position."""
    stack: list[tuple[object, tuple[int, ...]]] = [(obj, ())]
    while stack:
        item, where = stack.pop()
        if isinstance(item, (list, tuple)):
            if len(where) >= _MAX_NEST:
                raise ValueError(f"{name} must be [layers][experts] or [windows][layers][experts]: lists nest "
                                 f"deeper than {_MAX_NEST} levels")
            stack.extend(reversed([(x, (*where, i)) for i, x in enumerate(item)]))
        elif isinstance(item, np.ndarray):
            _numeric_dtype(item.dtype, name)
        elif isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, float, np.integer, np.floating)):
            at = "".join(f"[{i}]" for i in where)
            raise ValueError(f"{name} must hold numbers only, found {type(item).__name__} {_short(item)}"
                             + (f" at {at}" if at else ""))


def _numeric_dtype(dtype: np.dtype, name: str) -> None:
    if dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold numbers only (int or float), got an array of {dtype}")


def _short(item) -> str:
    text = repr(item)
    return text if len(text) <= 40 else text[:37] + "..."


def as_counts(counts, name: str = "counts", ndim: tuple[int, ...] = (2,)) -> np.ndarray:
    """Validate expert counts and return them as float64 (shape [L, E] or [W, L, E] per ``ndim``).

    ValueError (never another exception) unless counts are ints or floats (bools and strings are refused, not
    converted), rectangular, finite and >= 0, summing to at most MAX_COUNT_SUM in all, with every layer of
    every window summing to 0 or at least MIN_ROW_SUM."""
    if isinstance(counts, np.ndarray):
        _numeric_dtype(counts.dtype, name)
    else:
        _numbers_only(counts, name)
    try:
        arr = np.asarray(counts, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{name} must be a rectangular array of numbers [layers][experts] or "
                         f"[windows][layers][experts] within the float range ({exc})") from None
    if arr.ndim not in ndim:
        want = " or ".join(f"{d}-D" for d in ndim)
        raise ValueError(f"{name} must be {want} (layers x experts), got shape {arr.shape}")
    if arr.size == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    if np.any(arr < 0):
        raise ValueError(f"{name} contains negative counts")
    with np.errstate(over="ignore"):
        rows = arr.sum(-1)
        total = rows.sum()
    if not total <= MAX_COUNT_SUM:
        raise ValueError(f"{name} sum to {total:.3g}, above the planner's limit of {MAX_COUNT_SUM:g}: "
                         "scale them down (only their ratios matter)")
    tiny = (rows > 0) & (rows < MIN_ROW_SUM)
    if tiny.any():
        where = "".join(f"[{int(i)}]" for i in np.argwhere(tiny)[0])
        raise ValueError(f"{name}{where} sum to {rows[tiny].flat[0]:.3g}, below the planner's limit of "
                         f"{MIN_ROW_SUM:g} for a layer with tokens: scale them up (only their ratios matter)")
    return arr


CHUNK_STEPS = 512  # steps scored at once by the replaying tools (bounds their [steps, L, P] temporaries)


def whole_number(value, name: str, minimum: int | None = None) -> int:
    """value as an int (numpy integers welcome, bools not), at least `minimum` when given; ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a whole number, got {_short(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {_short(value)}")
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


def replica_counts(layout_LP: np.ndarray, num_experts: int) -> np.ndarray:
    """Replicas per logical expert, int64 [L, E]."""
    layout_LP = np.asarray(layout_LP, dtype=np.int64)
    L = layout_LP.shape[0]
    offs = (np.arange(L, dtype=np.int64) * num_experts)[:, None]
    return np.bincount((layout_LP + offs).ravel(), minlength=L * num_experts).reshape(L, num_experts)


def slot_weights(counts_LE: np.ndarray, layout_LP: np.ndarray) -> np.ndarray:
    """Per-slot load count[e] / replicas[e]: [L, P], or [X, L, P] for counts [X, L, E] (steps or windows)."""
    E = counts_LE.shape[-1]
    rep_LE = replica_counts(layout_LP, E)
    per_rep = counts_LE / np.maximum(rep_LE, 1)
    if per_rep.ndim == 2:
        return np.take_along_axis(per_rep, layout_LP, axis=1)
    return np.take_along_axis(per_rep, np.broadcast_to(layout_LP, per_rep.shape[:2] + layout_LP.shape[1:]),
                              axis=2)


def gpu_loads(counts_LE: np.ndarray, layout_LP: np.ndarray, gpus: int) -> np.ndarray:
    """GPU loads [L, G] (or [X, L, G] for counts [X, L, E], steps or windows) under ``layout_LP``."""
    w = slot_weights(np.asarray(counts_LE, dtype=np.float64), np.asarray(layout_LP, dtype=np.int64))
    return w.reshape(w.shape[:-1] + (gpus, -1)).sum(-1)


def balancedness_or_nan(loads_XG) -> np.ndarray:
    """eta = mean/max over the last axis (GPUs), [..., G] -> [...]; NaN where every GPU has load 0.

    The one implementation of the ratio: views (dashboard.analytics, the What-if page) keep NaN so idle
    (step, layer) pairs drop out of NaN-safe means; the planner's ``imbalance``/``balancedness`` map NaN
    to 1.0 so an idle (dense) layer is perfectly balanced in its sums."""
    loads_XG = np.asarray(loads_XG, dtype=np.float64)
    if loads_XG.ndim < 1 or loads_XG.shape[-1] == 0:
        raise ValueError(f"loads need a GPU axis last, got shape {loads_XG.shape}")
    peak = loads_XG.max(axis=-1)
    mean = loads_XG.mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(peak > 0, mean / np.where(peak > 0, peak, 1.0), np.nan)


def imbalance_or_nan(loads_XG) -> np.ndarray:
    """max/mean over the last axis = 1/eta; NaN where every GPU has load 0."""
    return 1.0 / balancedness_or_nan(loads_XG)


def imbalance(load_LG: np.ndarray) -> np.ndarray:
    """max/mean of GPU loads along the last axis; 1.0 where a layer has no traffic (planner rule)."""
    return np.nan_to_num(imbalance_or_nan(load_LG), nan=1.0)


def balancedness(load_LG: np.ndarray) -> np.ndarray:
    """mean/max of GPU loads along the last axis (SGLang/vLLM 'balancedness'); 1.0 for idle layers."""
    return np.nan_to_num(balancedness_or_nan(load_LG), nan=1.0)


def validated_layout(layout_LP, num_experts: int, gpus: int) -> np.ndarray:
    """physical_to_logical_map [L][P] (lists or array) -> int64 [L, P]. ValueError when it is not a
    rectangular integer table, names experts outside [0, E), leaves an expert without a slot, or P does not
    split evenly over `gpus`."""
    try:
        lay = np.asarray(layout_LP)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"physical_to_logical_map must be a rectangular [layers][slots] integer list: {exc}") from None
    if lay.dtype == object or lay.ndim != 2 or lay.shape[1] == 0:
        raise ValueError(f"physical_to_logical_map must be a rectangular [layers][slots] integer list, "
                         f"got shape {lay.shape}")
    if not np.issubdtype(lay.dtype, np.integer) and (
            not np.issubdtype(lay.dtype, np.number) or not np.all(np.equal(np.mod(lay, 1), 0))):
        raise ValueError("physical_to_logical_map holds non-integer expert ids")
    lay = lay.astype(np.int64)
    if gpus < 1 or lay.shape[1] % gpus:
        raise ValueError(f"{lay.shape[1]} slots per layer do not split evenly over {gpus} GPUs")
    if lay.min() < 0 or lay.max() >= num_experts:
        raise ValueError(f"physical_to_logical_map names experts outside 0..{num_experts - 1}")
    rep_LE = replica_counts(lay, num_experts)
    if np.any(rep_LE == 0):
        layer, expert = np.argwhere(rep_LE == 0)[0]
        raise ValueError(f"layer {layer}: expert {expert} has no slot in the layout")
    return lay


def gpu_weights(layout_LP, num_experts: int, gpus: int) -> np.ndarray:
    """float32 [L, E, G]: share of expert e's tokens that GPU g serves in layer l (even split over its
    replicas); every (l, e) row sums to 1. The layout is checked by validated_layout()."""
    lay = validated_layout(layout_LP, num_experts, gpus)
    rep_LE = replica_counts(lay, num_experts)
    L, P = lay.shape
    gpu_P = np.arange(P) // (P // gpus)
    flat = (np.arange(L)[:, None] * num_experts + lay) * gpus + gpu_P[None, :]
    share_LP = 1.0 / np.take_along_axis(rep_LE, lay, axis=1)
    weights = np.bincount(flat.ravel(), weights=share_LP.ravel(), minlength=L * num_experts * gpus)
    return weights.reshape(L, num_experts, gpus).astype(np.float32)


def weighted_loads(counts_TLE, weights_LEG: np.ndarray) -> np.ndarray:
    """float32 [T, L, G] GPU loads of each step and layer from counts [T, L, E] and gpu_weights() [L, E, G]
    (the matmul form of gpu_loads, for many steps under one layout)."""
    counts_TLE = np.asarray(counts_TLE)
    if counts_TLE.ndim != 3:
        raise ValueError(f"counts must be [steps, layers, experts], got shape {counts_TLE.shape}")
    if counts_TLE.shape[1:] != weights_LEG.shape[:2]:
        raise ValueError(f"counts are [L, E] = {counts_TLE.shape[1:]}, the layout is for {weights_LEG.shape[:2]}")
    loads_LTG = np.matmul(counts_TLE.astype(np.float32).transpose(1, 0, 2), weights_LEG)
    return np.ascontiguousarray(loads_LTG.transpose(1, 0, 2))


def layer_imbalance(counts_LE, layout_LP, gpus: int) -> np.ndarray:
    """Per-layer max/mean GPU load of a layout on given counts, [L] (or [T, L])."""
    return imbalance(gpu_loads(counts_LE, layout_LP, gpus))


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

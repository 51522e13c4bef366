"""RunMeta and Layout: what a run writes once (model sizes, layer names, the replica layout)."""
from __future__ import annotations

import json
import math
import operator
from dataclasses import asdict, dataclass, field

import numpy as np

from .fields import _in_range, _is_int, _json
from .keys import (
    DISPATCH_POLICIES,
    MAX_CELLS,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_META_BYTES,
    MAX_NAME_CHARS,
    MAX_SLOTS,
    MAX_TIME_S,
    MAX_WORLD,
    SCHEMA_VERSION,
    check_run_name,
)

MAX_MODEL_DIM = 1 << 24  # hidden_size and moe_intermediate_size of the metadata
MAX_DTYPE_BYTES = 64


def _short(value) -> str:
    """value for a message: a huge int is not spelled out (str() of 10**5000 would itself fail)."""
    return str(value) if not _is_int(value) or abs(value) < 10**20 else "a huge number"


def _size(value, name: str, lo: int, hi: int) -> int:
    """value as an int in lo..hi (numpy integers welcome); ValueError otherwise."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
    if isinstance(value, bool) or not lo <= number <= hi:
        raise ValueError(f"{name} = {_short(number)} is outside {lo}..{hi}")
    return int(number)


def check_sizes(num_layers, num_experts, num_slots=None) -> tuple[int, int, int]:
    """(L, E, P) as ints within the bounds in core/keys.py (L <= MAX_LAYERS, E <= MAX_EXPERTS, P <= MAX_SLOTS,
    L x P <= MAX_CELLS; P defaults to E); ValueError naming the first that is not."""
    num_layers = _size(num_layers, "layers", 1, MAX_LAYERS)
    num_experts = _size(num_experts, "experts", 1, MAX_EXPERTS)
    num_slots = num_experts if num_slots is None else _size(num_slots, "slots per layer", 0, MAX_SLOTS)
    if num_layers * max(num_slots, num_experts) > MAX_CELLS:
        raise ValueError(f"{num_layers} layers x {max(num_slots, num_experts)} slots exceed {MAX_CELLS} cells")
    return num_layers, num_experts, num_slots


def contiguous_layout(num_layers: int, num_experts: int, num_slots: int | None = None) -> list[list[int]]:
    """physical_to_logical_map [L][P] with P = num_slots (default E): slot p holds expert p % E."""
    num_layers, num_experts, num_slots = check_sizes(num_layers, num_experts, num_slots)
    if num_slots < num_experts:
        raise ValueError(f"{num_slots} slots cannot hold {num_experts} experts")
    row = [p % num_experts for p in range(num_slots)]
    return [list(row) for _ in range(num_layers)]


@dataclass
class Layout:
    """Where the replicas live. physical_to_logical_map: [L][P] (SGLang's name and shape);
    GPU of slot p is p // (P / gpus); node of GPU g is g // (gpus / nodes)."""

    gpus: int
    nodes: int
    physical_to_logical_map: list[list[int]]

    def validate(self, num_layers: int, num_experts: int) -> Layout:
        """self when the map fits a run of num_layers x num_experts: L rows of P slots each, P a multiple of
        gpus, every expert 0..E-1 in every row and nothing else; ValueError otherwise. Sizes are checked
        against the bounds in core/keys.py before anything is allocated, and the map with numpy."""
        check_layout_map(self.physical_to_logical_map, self.gpus, self.nodes, num_layers, num_experts)
        return self


def check_layout_map(rows, gpus, nodes, num_layers, num_experts, *, unused: bool = False) -> np.ndarray:
    """The one check of a replica layout (Layout.validate and core.LayoutRecord.validate): rows, a
    physical_to_logical_map [L][P] as nested lists or an int array, fits a run of num_layers x num_experts
    on gpus GPUs in nodes nodes: L rows of P slots each, P a multiple of gpus, gpus a multiple of nodes, every
    expert 0..E-1 in every row and nothing else (unused=True: also -1, a slot that holds no expert). Returns the
    map as an int array [L, P]; ValueError otherwise. Sizes are checked against the bounds in core/keys.py
    before anything is allocated."""
    num_layers, num_experts, _ = check_sizes(num_layers, num_experts)
    if not (_in_range(_index_or_none(gpus), 1, MAX_SLOTS) and _in_range(_index_or_none(nodes), 1, MAX_SLOTS)) \
            or gpus % nodes:
        raise ValueError(f"gpus={_short(gpus)} must be a positive multiple of nodes={_short(nodes)} "
                         f"(at most {MAX_SLOTS})")
    try:
        num_rows = len(rows)
        widths = [len(row) for row in rows] if num_rows <= MAX_LAYERS else []
    except TypeError:
        raise ValueError("physical_to_logical_map must be a list of rows [L][P]") from None
    if num_rows != num_layers:
        raise ValueError(f"layout has {num_rows} layers, the model has {num_layers}")
    for layer, width in enumerate(widths):
        if width % gpus or width != widths[0]:
            raise ValueError(f"layer {layer}: {width} slots do not split evenly over {gpus} GPUs")
    num_slots = widths[0]
    check_sizes(num_layers, num_experts, num_slots)
    try:
        layout_LP = np.asarray(rows).reshape(num_layers, num_slots)
    except (ValueError, TypeError, OverflowError):
        raise ValueError("physical_to_logical_map must hold integer expert ids") from None
    if layout_LP.dtype.kind not in "iu" and layout_LP.size:
        raise ValueError("physical_to_logical_map must hold integer expert ids")
    if num_slots == 0:
        bad_L = np.ones(num_layers, dtype=bool)
    else:
        sorted_LP = np.sort(layout_LP, axis=1)
        gap_L = sorted_LP[:, 0] < 0  # a row with an unused slot: -1 is one more distinct value
        distinct_L = 1 + np.count_nonzero(np.diff(sorted_LP, axis=1), axis=1) - (gap_L if unused else 0)
        bad_L = (sorted_LP[:, 0] < (-1 if unused else 0)) | (sorted_LP[:, -1] >= num_experts) \
            | (distinct_L != num_experts)
    if bad_L.any():
        layer = int(np.argmax(bad_L))
        row = layout_LP[layer] if num_slots else np.zeros(0, dtype=np.int64)
        inside = not row.size or (row.min() >= (-1 if unused else 0) and row.max() < num_experts)
        low = -1 if unused else 0
        outside = row[(row < low) | (row >= num_experts)] if row.size else row
        what = (f"expert {int(np.argmin(np.bincount(row[row >= 0], minlength=num_experts)))} has no slot"
                if inside else f"names expert {int(outside[0])}, outside 0..{num_experts - 1}")
        raise ValueError(f"layer {layer}: {what} (every expert 0..{num_experts - 1} needs a slot, and only those"
                         + (", or -1 for an unused slot)" if unused else ")"))
    return layout_LP


def _index_or_none(value):
    """value as a Python int when it is an integer (numpy included, bool excluded), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def default_gpus(num_experts: int, world_size: int = 1) -> int:
    """GPUs of the default layout: the EP world size when distributed, else the largest of 32, 16, 8, 4, 2, 1
    that divides E (a typical DeepSeek-class EP deployment)."""
    if world_size > 1 and num_experts % world_size == 0:
        return world_size
    return next(g for g in (32, 16, 8, 4, 2, 1) if num_experts % g == 0)


@dataclass
class RunMeta:
    """Written once per run. Sizes feed the traffic model (2*k*d*b bytes per token per layer) and the
    memory cost of a replica (3 * hidden * moe_intermediate * dtype_bytes for a gated FFN). dispatch: how the
    engine shares an expert's tokens among its replicas, one of core.dispatch.DISPATCH_POLICIES (docs/definitions.md,
    "Dispatch policy"); metadata written before the field existed reads as "even"."""

    run: str
    model_name: str
    layer_names: list[str]
    num_experts: int
    top_k: int
    hidden_size: int
    moe_intermediate_size: int
    dtype_bytes: int
    layout: Layout
    world_size: int = 1
    started_s: float = 0.0
    host: str = ""
    sample_tokens_per_layer: int = 0
    extra: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    instance: str = ""
    dispatch: str = "even"
    expert_matrices: int = 3
    act_dtype_bytes: int = 0
    gpu_profile: str = ""


def encode_meta(meta: RunMeta) -> str:
    meta.layout.validate(len(meta.layer_names), meta.num_experts)
    check_run_name(meta.run)
    _check_dispatch(meta.dispatch)
    return json.dumps(asdict(meta), separators=(",", ":"))


_META_TYPES: dict[str, type | tuple[type, ...]] = {"run": str, "model_name": str, "layer_names": list, "num_experts": int, "top_k": int,
               "hidden_size": int, "moe_intermediate_size": int, "dtype_bytes": int, "world_size": int,
               "started_s": (int, float), "host": str, "sample_tokens_per_layer": int, "extra": dict,
               "schema_version": int, "instance": str, "dispatch": str,
               "expert_matrices": int, "act_dtype_bytes": int, "gpu_profile": str}


# int fields of the metadata and their bounds (inclusive)
_META_INT_BOUNDS = {"num_experts": (1, MAX_EXPERTS), "top_k": (0, MAX_EXPERTS), "hidden_size": (0, MAX_MODEL_DIM),
                    "moe_intermediate_size": (0, MAX_MODEL_DIM), "dtype_bytes": (0, MAX_DTYPE_BYTES),
                    "world_size": (1, MAX_WORLD), "sample_tokens_per_layer": (0, MAX_CELLS),
                    "schema_version": (0, 1 << 31), "expert_matrices": (1, 16), "act_dtype_bytes": (0, MAX_DTYPE_BYTES)}
_LAYOUT_SHAPE = "run metadata layout must be {gpus: int, nodes: int, physical_to_logical_map: [[int]]}"


def decode_meta(text: str | bytes) -> RunMeta:
    """JSON -> RunMeta; ValueError (never another exception) when it is not valid JSON, lacks fields, holds a
    field of the wrong type or a size outside the bounds in core/keys.py (at most MAX_META_BYTES of JSON,
    L <= MAX_LAYERS layer names, E <= MAX_EXPERTS, a layout of at most MAX_SLOTS slots per layer and MAX_CELLS
    in all, world_size <= MAX_WORLD), checked before anything of that size is built."""
    raw = _json(text, "run metadata", MAX_META_BYTES)
    if not isinstance(raw, dict) or not isinstance(raw.get("layout"), dict):
        raise ValueError("run metadata must be an object with a 'layout' object")
    for name, value in raw.items():
        want = _META_TYPES.get(name)
        if want is None and name != "layout":
            raise ValueError(f"run metadata has an unknown field {_short(name)[:80]!r}")
        if want is int and not _is_int(value) or want not in (None, int) and not isinstance(value, want):
            raise ValueError(f"run metadata field {name!r} has the wrong type ({type(value).__name__})")
        if name in _META_INT_BOUNDS and not _in_range(value, *_META_INT_BOUNDS[name]):
            low, high = _META_INT_BOUNDS[name]
            raise ValueError(f"run metadata field {name!r} = {_short(value)} is outside {low}..{high}")
    started = raw.get("started_s", 0.0)
    if _is_int(started) and abs(started) >= MAX_TIME_S or not _is_int(started) and not (
            isinstance(started, float) and math.isfinite(started) and abs(started) < MAX_TIME_S):
        raise ValueError(f"run metadata field 'started_s' must be a finite time below {MAX_TIME_S:g} s")
    for name in ("instance", "host", "gpu_profile"):
        if len(raw.get(name, "")) > MAX_NAME_CHARS:
            raise ValueError(f"run metadata field {name!r} is longer than {MAX_NAME_CHARS} characters")
    _check_dispatch(raw.get("dispatch", "even"))
    names = raw.get("layer_names", [])
    if len(names) > MAX_LAYERS:
        raise ValueError(f"run metadata has {len(names)} layer names, at most {MAX_LAYERS} are supported")
    if not all(isinstance(n, str) for n in names):
        raise ValueError("run metadata layer_names must be strings")
    lay = raw.pop("layout")
    rows = lay.get("physical_to_logical_map")
    if not (_is_int(lay.get("gpus")) and _is_int(lay.get("nodes")) and isinstance(rows, list)) or set(lay) - {
            "gpus", "nodes", "physical_to_logical_map"}:
        raise ValueError(_LAYOUT_SHAPE)
    _check_rows(rows, _LAYOUT_SHAPE)
    check_run_name(raw.get("run", ""))
    try:
        meta = RunMeta(layout=Layout(**lay), **raw)
    except TypeError as exc:
        raise ValueError(f"run metadata is malformed: {exc}") from None
    if meta.schema_version != SCHEMA_VERSION:
        raise ValueError(f"run metadata schema {meta.schema_version} is not supported")
    meta.layout.validate(len(meta.layer_names), meta.num_experts)
    return meta


def _check_dispatch(policy) -> None:
    """ValueError unless policy is one of core.dispatch.DISPATCH_POLICIES."""
    if policy not in DISPATCH_POLICIES:
        raise ValueError(f"run metadata field 'dispatch' = {_short(policy)[:80]!r} is not a dispatch policy "
                         f"(one of {', '.join(DISPATCH_POLICIES)})")


def _check_rows(rows, shape_message: str, ints_message: str = "") -> None:
    """rows is a list of at most MAX_LAYERS lists of at most MAX_SLOTS ints each, MAX_CELLS in all, every
    id in 0..MAX_EXPERTS - 1; ValueError otherwise (sizes before contents)."""
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows[:MAX_LAYERS + 1]):
        raise ValueError(shape_message)
    if len(rows) > MAX_LAYERS:
        raise ValueError(f"physical_to_logical_map has {len(rows)} layers, at most {MAX_LAYERS} are supported")
    cells = sum(len(r) for r in rows)
    if max(map(len, rows), default=0) > MAX_SLOTS or cells > MAX_CELLS:
        raise ValueError(f"physical_to_logical_map has {cells} slots over {len(rows)} layers: at most {MAX_SLOTS} "
                         f"per layer and {MAX_CELLS} in all are supported")
    if not all(_is_int(v) for row in rows for v in row):
        raise ValueError(ints_message or shape_message)
    if not all(0 <= v < MAX_EXPERTS for row in rows for v in row):
        raise ValueError(f"physical_to_logical_map must hold expert ids 0..{MAX_EXPERTS - 1}")


def parse_layout_json(text: str | bytes) -> list[list[int]]:
    """SGLang's {"physical_to_logical_map": [[...], ...]} -> the map [L][P] of int expert ids: the one parser of
    layout files (the dashboard's upload and the planner's --current). Whether the map fits a run (layers,
    experts, GPUs) is Layout.validate's job. ValueError (never another exception) when the text is not such a
    JSON object, or exceeds the bounds in core/keys.py (MAX_META_BYTES of text, MAX_LAYERS rows of at most
    MAX_SLOTS ids, MAX_CELLS in all, ids 0..MAX_EXPERTS - 1)."""
    raw = _json(text, "layout file", MAX_META_BYTES)
    rows = raw.get("physical_to_logical_map") if isinstance(raw, dict) else None
    shape = 'layout file needs {"physical_to_logical_map": [[slot experts of layer 0], ...]}'
    if not isinstance(rows, list) or not rows:
        raise ValueError(shape)
    _check_rows(rows, shape, "physical_to_logical_map must hold integer expert ids")
    return rows

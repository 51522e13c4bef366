"""RunMeta and Layout: what a run writes once (model sizes, layer names, the replica layout)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .fields import _is_int
from .keys import SCHEMA_VERSION, check_run_name


def contiguous_layout(num_layers: int, num_experts: int, num_slots: int | None = None) -> list[list[int]]:
    """physical_to_logical_map [L][P] with P = num_slots (default E): slot p holds expert p % E."""
    num_slots = num_experts if num_slots is None else num_slots
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
        if self.gpus < 1 or self.nodes < 1 or self.gpus % self.nodes:
            raise ValueError(f"gpus={self.gpus} must be a positive multiple of nodes={self.nodes}")
        rows = self.physical_to_logical_map
        if len(rows) != num_layers:
            raise ValueError(f"layout has {len(rows)} layers, the model has {num_layers}")
        for layer, row in enumerate(rows):
            if len(row) % self.gpus or len(row) != len(rows[0]):
                raise ValueError(f"layer {layer}: {len(row)} slots do not split evenly over {self.gpus} GPUs")
            if sorted(set(row)) != list(range(num_experts)):
                raise ValueError(f"layer {layer}: every expert 0..{num_experts - 1} needs a slot, and only those")
        return self


def default_gpus(num_experts: int, world_size: int = 1) -> int:
    """GPUs of the default layout: the EP world size when distributed, else the largest of 32, 16, 8, 4, 2, 1
    that divides E (a typical DeepSeek-class EP deployment)."""
    if world_size > 1 and num_experts % world_size == 0:
        return world_size
    return next(g for g in (32, 16, 8, 4, 2, 1) if num_experts % g == 0)


@dataclass
class RunMeta:
    """Written once per run. Sizes feed the traffic model (2*k*d*b bytes per token per layer) and the
    memory cost of a replica (3 * hidden * moe_intermediate * dtype_bytes for a gated FFN)."""

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


def encode_meta(meta: RunMeta) -> str:
    meta.layout.validate(len(meta.layer_names), meta.num_experts)
    check_run_name(meta.run)
    return json.dumps(asdict(meta), separators=(",", ":"))


_META_TYPES: dict[str, type | tuple[type, ...]] = {"run": str, "model_name": str, "layer_names": list, "num_experts": int, "top_k": int,
               "hidden_size": int, "moe_intermediate_size": int, "dtype_bytes": int, "world_size": int,
               "started_s": (int, float), "host": str, "sample_tokens_per_layer": int, "extra": dict,
               "schema_version": int, "instance": str}


def decode_meta(text: str | bytes) -> RunMeta:
    """JSON -> RunMeta; ValueError (never another exception) when it is not valid JSON, lacks fields or
    holds a field of the wrong type."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
        raise ValueError(f"run metadata is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("layout"), dict):
        raise ValueError("run metadata must be an object with a 'layout' object")
    for name, value in raw.items():
        want = _META_TYPES.get(name)
        if want is None and name != "layout":
            raise ValueError(f"run metadata has an unknown field {name!r}")
        if want is int and not _is_int(value) or want not in (None, int) and not isinstance(value, want):
            raise ValueError(f"run metadata field {name!r} has the wrong type ({type(value).__name__})")
    if not all(isinstance(n, str) for n in raw.get("layer_names", [])):
        raise ValueError("run metadata layer_names must be strings")
    lay = raw.pop("layout")
    rows = lay.get("physical_to_logical_map")
    if not (_is_int(lay.get("gpus")) and _is_int(lay.get("nodes")) and isinstance(rows, list)
            and all(isinstance(r, list) and all(_is_int(v) for v in r) for r in rows)) or set(lay) - {
            "gpus", "nodes", "physical_to_logical_map"}:
        raise ValueError("run metadata layout must be {gpus: int, nodes: int, physical_to_logical_map: [[int]]}")
    try:
        meta = RunMeta(layout=Layout(**lay), **raw)
    except TypeError as exc:
        raise ValueError(f"run metadata is malformed: {exc}") from None
    if meta.schema_version != SCHEMA_VERSION:
        raise ValueError(f"run metadata schema {meta.schema_version} is not supported")
    meta.layout.validate(len(meta.layer_names), meta.num_experts)
    return meta


def parse_layout_json(text: str | bytes) -> list[list[int]]:
    """SGLang's {"physical_to_logical_map": [[...], ...]} -> the map [L][P] of int expert ids: the one parser of
    layout files (the dashboard's upload and the planner's --current). Whether the map fits a run (layers,
    experts, GPUs) is Layout.validate's job. ValueError when the text is not such a JSON object."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"layout file is not JSON: {exc}") from None
    rows = raw.get("physical_to_logical_map") if isinstance(raw, dict) else None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise ValueError('layout file needs {"physical_to_logical_map": [[slot experts of layer 0], ...]}')
    if not all(isinstance(v, int) and not isinstance(v, bool) for row in rows for v in row):
        raise ValueError("physical_to_logical_map must hold integer expert ids")
    return rows

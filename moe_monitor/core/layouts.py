"""LayoutRecord: a replica layout coming into force during a run (an engine's EPLB rebalance, a layout
applied by hand), and its stream encoding (the map as raw little-endian int32 bytes); and the layouts engines
write to files: vLLM's -1 (UNUSED, a physical slot holding no expert) and GPUs holding different numbers of slots.

Shape legend: L MoE layers, P physical slots (slot p lives on GPU p // (P / gpus)), E logical experts.
The run metadata holds the layout the run started with; a layout record says from which step (the run's
step ids) a new physical_to_logical_map is in force, until the next record.

A layout file's map is [L][P] (ids, -1 for an unused slot) or [L][G][slots of GPU g] (a list per GPU, of any
lengths): engine_layout() makes both int64 [L, G * S] with -1 padding each GPU to S = its fullest GPU's slots.
Scoring treats an unused slot as holding nothing: with_unused_as_expert() gives it a phantom expert E with no
tokens (counts padded with one zero column), so every load model and dispatch policy reads it as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fields import _instance, _int, _is_int, _json, _raw, _text, _time, _version
from .keys import (
    COUNTS_DTYPE,
    MAX_CELLS,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_META_BYTES,
    MAX_SLOTS,
    MAX_STEP,
    MAX_WORLD,
    SCHEMA_VERSION,
    check_run_name,
)
from .meta import check_layout_map

# Who issued a layout: "initial" the layout a run starts with, "engine" the serving engine's own rebalance
# (vLLM / SGLang EPLB), "apply" a layout applied by an operator (the What-if export, a planner run).
LAYOUT_SOURCES = ("initial", "engine", "apply")
LAYOUT_FIELDS = ("v", "run", "inst", "rank", "step", "t", "L", "P", "gpus", "nodes", "source", "map")
LAYOUT_DTYPE = COUNTS_DTYPE  # little-endian int32
UNUSED = -1  # vLLM's id of a physical slot that holds no expert


@dataclass(frozen=True)
class LayoutRecord:
    """A physical_to_logical_map in force from `step` on.

    layout_LP: int32 [L, P] logical expert of each physical slot (SGLang's
    physical_to_logical_map); GPU of slot p is p // (P / gpus), node of GPU g is g // (gpus / nodes).
    step: first step id (the run's step ids) at which this layout is in force.
    time_s: unix seconds when it was issued. rank, instance: the collector that published it.
    Decoding checks sizes and id bounds only; that every expert 0..E-1 has a slot in every row needs E,
    which the reader knows from the run metadata: call validate(num_experts) before using the map.
    """

    run: str
    step: int
    time_s: float
    layout_LP: np.ndarray
    gpus: int
    nodes: int = 1
    source: str = "engine"
    rank: int = 0
    instance: str = ""

    @property
    def num_layers(self) -> int:
        return int(self.layout_LP.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.layout_LP.shape[1])

    def validate(self, num_experts: int, *, num_layers: int | None = None, unused: bool = False) -> LayoutRecord:
        """self when the map fits a run of num_experts experts (and num_layers layers, when given): every
        expert 0..E-1 in every row and nothing else, P a multiple of gpus, gpus a multiple of nodes (the
        check of core.Layout.validate); ValueError otherwise. unused=True also lets slots be UNUSED (-1), for
        readers that read them (core.loadmodel and every dispatch policy do)."""
        layout_LP = self.layout_LP
        if not isinstance(layout_LP, np.ndarray) or layout_LP.ndim != 2:
            raise ValueError("layout_LP must be a 2-D int array [layers, slots]")
        rows = layout_LP.shape[0] if num_layers is None else num_layers
        if not unused and layout_LP.size and layout_LP.min() < 0:
            raise ValueError("the layout leaves slots unused (-1); this reader needs an expert in every slot")
        check_layout_map(layout_LP, self.gpus, self.nodes, rows, num_experts, unused=unused)
        return self


def encode_layout_record(rec: LayoutRecord) -> dict[str, bytes | str | int]:
    """LayoutRecord -> stream entry fields (values redis-py can send as they are). ValueError when the record
    is one decode_layout_record would refuse (shape, sizes, ids, gpus, nodes, source, step, time)."""
    layout_LP = np.asarray(rec.layout_LP)
    if layout_LP.ndim != 2 or layout_LP.dtype.kind not in "iu":
        raise ValueError(f"layout_LP must be a 2-D int array [layers, slots], got "
                         f"{layout_LP.dtype} {layout_LP.shape}")
    if layout_LP.size and (layout_LP.min() < UNUSED or layout_LP.max() >= MAX_EXPERTS):
        raise ValueError(f"layout_LP must hold expert ids 0..{MAX_EXPERTS - 1} (or {UNUSED}: an unused slot)")
    fields: dict[str, bytes | str | int] = {
        "v": SCHEMA_VERSION,
        "run": check_run_name(rec.run),
        "inst": rec.instance,
        "rank": int(rec.rank),
        "step": int(rec.step),
        "t": repr(float(rec.time_s)),
        "L": layout_LP.shape[0],
        "P": layout_LP.shape[1],
        "gpus": int(rec.gpus),
        "nodes": int(rec.nodes),
        "source": rec.source,
        "map": np.ascontiguousarray(layout_LP, dtype=LAYOUT_DTYPE).tobytes(),
    }
    decode_layout_record(fields)  # one set of rules: what the reader would refuse is never written
    return fields


def decode_layout_record(fields: dict) -> LayoutRecord:
    """Stream entry fields (bytes or str keys) -> LayoutRecord. Raises ValueError (never another exception)
    on any malformed entry: wrong schema version, missing field, wrong byte length, an expert id outside
    -1..MAX_EXPERTS - 1 (-1: an unused slot, which validate() refuses unless told), gpus not dividing P, nodes not dividing gpus, an unknown source, or a number outside
    the bounds in core/keys.py (L <= MAX_LAYERS, P <= MAX_SLOTS, L x P <= MAX_CELLS, step < MAX_STEP,
    rank < MAX_WORLD, |t| < MAX_TIME_S, instance id <= MAX_NAME_CHARS). Whether every expert has a slot is
    LayoutRecord.validate(num_experts)'s job."""
    _version(fields, SCHEMA_VERSION)
    num_layers, num_slots = _int(fields, "L", 1, MAX_LAYERS + 1), _int(fields, "P", 1, MAX_SLOTS + 1)
    if num_layers * num_slots > MAX_CELLS:
        raise ValueError(f"layout of {num_layers}x{num_slots} exceeds {MAX_CELLS} cells")
    raw = _raw(fields, "map")
    if len(raw) != num_layers * num_slots * LAYOUT_DTYPE.itemsize:
        raise ValueError(f"map has {len(raw)} bytes, expected {num_layers}x{num_slots} int32")
    layout_LP = np.frombuffer(raw, dtype=LAYOUT_DTYPE).reshape(num_layers, num_slots)
    if layout_LP.min() < UNUSED or layout_LP.max() >= MAX_EXPERTS:
        raise ValueError(f"map holds expert ids outside 0..{MAX_EXPERTS - 1} (and {UNUSED}, an unused slot)")
    gpus = _int(fields, "gpus", 1, MAX_SLOTS + 1)
    nodes = _int(fields, "nodes", 1, MAX_SLOTS + 1)
    if num_slots % gpus:
        raise ValueError(f"{num_slots} slots do not split evenly over gpus={gpus}")
    if gpus % nodes:
        raise ValueError(f"gpus={gpus} do not split evenly over nodes={nodes}")
    source = _text(fields, "source", max_chars=16)
    if source not in LAYOUT_SOURCES:
        raise ValueError(f"unknown layout source {source!r} (one of {LAYOUT_SOURCES})")
    instance = _instance(fields)
    return LayoutRecord(
        run=check_run_name(_text(fields, "run", max_chars=128)), step=_int(fields, "step", 0, MAX_STEP),
        time_s=_time(fields, "t"), layout_LP=layout_LP, gpus=gpus, nodes=nodes, source=source,
        rank=_int(fields, "rank", 0, MAX_WORLD), instance=instance,
    )


def engine_layout(rows, gpus: int | None = None) -> tuple[np.ndarray, int | None]:
    """A physical_to_logical_map as engines write it -> (int64 [L, P] with UNUSED for an empty slot, the GPUs its
    shape says or None). rows: [L][P] ids (-1 allowed), or [L][G][slots of GPU g] (a list per GPU, lengths may
    differ: each GPU is padded with -1 to the fullest GPU's S, so P = G * S). gpus, when given, must match a
    per-GPU map's G. Sizes are checked (core/keys.py bounds) before anything is built; ValueError otherwise."""
    shape = "physical_to_logical_map must be [layers][slots] or [layers][GPUs][slots of the GPU]"
    if not isinstance(rows, list) or not rows or len(rows) > MAX_LAYERS:
        raise ValueError(f"{shape}, with 1..{MAX_LAYERS} layers")
    if not all(isinstance(row, list) for row in rows):
        raise ValueError(shape)
    per_gpu = any(row and isinstance(row[0], list) for row in rows)
    if not per_gpu:
        widths = {len(row) for row in rows}
        if len(widths) != 1:
            raise ValueError(f"{shape}: layers hold {min(widths)}..{max(widths)} slots (pad a GPU's unused slots "
                             f"with {UNUSED}, or give a list per GPU)")
        width = widths.pop()
        if not 1 <= width <= MAX_SLOTS or width * len(rows) > MAX_CELLS:
            raise ValueError(f"{len(rows)} layers x {width} slots: 1..{MAX_SLOTS} slots a layer, {MAX_CELLS} in all")
        flat = rows
        found_gpus = None
    else:
        if not all(isinstance(g, list) for row in rows for g in row):
            raise ValueError(f"{shape}: a layer mixes ids and per-GPU lists")
        counts = {len(row) for row in rows}
        if len(counts) != 1 or not 1 <= min(counts) <= MAX_SLOTS:
            raise ValueError(f"{shape}: every layer needs the same number of GPUs (1..{MAX_SLOTS})")
        found_gpus = counts.pop()
        per = max(len(g) for row in rows for g in row)
        if per < 1 or found_gpus * per > MAX_SLOTS or found_gpus * per * len(rows) > MAX_CELLS:
            raise ValueError(f"{len(rows)} layers x {found_gpus} GPUs x {per} slots exceed {MAX_SLOTS} slots a "
                             f"layer or {MAX_CELLS} in all")
        flat = [[v for g in row for v in g + [UNUSED] * (per - len(g))] for row in rows]
    if not all(_is_int(v) and UNUSED <= v < MAX_EXPERTS for row in flat for v in row):
        raise ValueError(f"physical_to_logical_map must hold whole expert ids 0..{MAX_EXPERTS - 1} "
                         f"({UNUSED}: an unused slot)")
    if gpus is not None and found_gpus is not None and gpus != found_gpus:
        raise ValueError(f"the map lists {found_gpus} GPUs, --gpus says {gpus}")
    return np.asarray(flat, dtype=np.int64), found_gpus


def parse_engine_layout_json(text: str | bytes) -> tuple[np.ndarray, int | None]:
    """{"physical_to_logical_map": ...} (SGLang's, vLLM's with -1, or a list per GPU; at most MAX_META_BYTES) ->
    engine_layout(map). ValueError (never another exception) otherwise."""
    raw = _json(text, "layout file", MAX_META_BYTES)
    rows = raw.get("physical_to_logical_map") if isinstance(raw, dict) else None
    if rows is None:
        raise ValueError('layout file needs {"physical_to_logical_map": [[slot experts of layer 0], ...]}')
    return engine_layout(rows)


def check_engine_layout(layout_LP, num_experts: int, gpus: int, num_layers: int | None = None) -> np.ndarray:
    """int64 [L, P] when layout_LP fits num_experts on gpus GPUs: ids in -1..E-1, every expert 0..E-1 in some
    slot of every layer, P a multiple of gpus (and L = num_layers, when given); ValueError otherwise."""
    lay = np.asarray(layout_LP)
    if lay.ndim != 2 or lay.dtype.kind not in "iu" or lay.shape[1] == 0:
        raise ValueError(f"a layout is an int array [layers, slots], got {lay.dtype} {lay.shape}")
    rows = lay.shape[0] if num_layers is None else num_layers
    return check_layout_map(lay, gpus, 1, rows, num_experts, unused=True).astype(np.int64)


def has_unused(layout_LP) -> bool:
    """Whether a layout leaves any slot UNUSED (-1)."""
    lay = np.asarray(layout_LP)
    return bool(lay.size and lay.min() < 0)


def with_unused_as_expert(counts_XLE: np.ndarray, layout_LP: np.ndarray, gpus: int = 1, *,
                          distinct: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(counts, layout) a scorer or planner reads as they are, with UNUSED slots holding nothing: a -1 becomes a
    phantom expert E (distinct: E + k for the k-th unused slot of its GPU, so no GPU holds one twice) and counts
    [..., L, E] gain zero columns (a phantom gets no token under any dispatch policy). A phantom must have a slot
    in every layer: a layer without enough unused slots gets one more slot per GPU holding phantom E (not with
    `distinct`: ValueError). Unchanged when no slot is unused. Back: unused_back()."""
    layout_LP = np.asarray(layout_LP, dtype=np.int64)
    if not has_unused(layout_LP):
        return counts_XLE, layout_LP
    num_experts = counts_XLE.shape[-1]
    L, P = layout_LP.shape
    unused_LGS = (layout_LP < 0).reshape(L, gpus, P // gpus)
    rank_LGS = np.cumsum(unused_LGS, axis=2) - 1  # k of each unused slot on its GPU
    phantoms = int(rank_LGS.max()) + 1 if distinct else 1
    ids_LP = (num_experts + (rank_LGS.reshape(L, P) if distinct else 0)) * np.ones((L, P), dtype=np.int64)
    lay = np.where(layout_LP < 0, ids_LP, layout_LP)
    held = np.stack([(lay == num_experts + k).any(axis=1) for k in range(phantoms)], axis=1)  # [L, phantoms]
    if not held.all():
        if distinct:
            layer = int(np.flatnonzero(~held.all(axis=1))[0])
            raise ValueError(f"layer {layer} has fewer unused slots (-1) per GPU than another layer: give every layer "
                             "the same unused slots per GPU")
        lay = np.concatenate([lay.reshape(L, gpus, P // gpus), np.full((L, gpus, 1), num_experts)], axis=2)
        lay = lay.reshape(L, -1)
    pad = [(0, 0)] * (counts_XLE.ndim - 1) + [(0, phantoms)]
    return np.pad(counts_XLE, pad), lay


def unused_back(layout_LP: np.ndarray, num_experts: int) -> np.ndarray:
    """A layout planned on with_unused_as_expert's counts, its phantom experts (E and above) written back as
    UNUSED (-1)."""
    layout_LP = np.asarray(layout_LP, dtype=np.int64)
    return np.where(layout_LP >= num_experts, UNUSED, layout_LP)


def unused_for_copies(before_LP, after_LP, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """Two layouts as planner.repair.experts_copied reads them when either leaves slots UNUSED: -1 becomes a
    phantom expert (an id above both layouts' experts) that every GPU held before (before gains one slot per GPU
    holding it), so emptying a slot copies nothing and filling one copies its expert. Unchanged otherwise."""
    a, b = np.asarray(before_LP, dtype=np.int64), np.asarray(after_LP, dtype=np.int64)
    if not (has_unused(a) or has_unused(b)) or a.ndim != 2 or gpus < 1 or a.shape[1] % gpus:
        return a, b
    phantom = int(max(a.max(initial=0), b.max(initial=0))) + 1
    L = a.shape[0]
    a = np.concatenate([np.where(a < 0, phantom, a).reshape(L, gpus, -1), np.full((L, gpus, 1), phantom)], axis=2)
    return a.reshape(L, -1), np.where(b < 0, phantom, b)

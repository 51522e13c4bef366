"""LayoutRecord: a replica layout coming into force during a run (an engine's EPLB rebalance, a layout
applied by hand), and its stream encoding (the map as raw little-endian int32 bytes).

Shape legend: L MoE layers, P physical slots (slot p lives on GPU p // (P / gpus)), E logical experts.
The run metadata holds the layout the run started with; a layout record says from which step (the run's
step ids) a new physical_to_logical_map is in force, until the next record.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fields import _instance, _int, _raw, _text, _time, _version
from .keys import (
    COUNTS_DTYPE,
    MAX_CELLS,
    MAX_EXPERTS,
    MAX_LAYERS,
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

    def validate(self, num_experts: int, *, num_layers: int | None = None) -> LayoutRecord:
        """self when the map fits a run of num_experts experts (and num_layers layers, when given): every
        expert 0..E-1 in every row and nothing else, P a multiple of gpus, gpus a multiple of nodes (the
        check of core.Layout.validate); ValueError otherwise."""
        layout_LP = self.layout_LP
        if not isinstance(layout_LP, np.ndarray) or layout_LP.ndim != 2:
            raise ValueError("layout_LP must be a 2-D int array [layers, slots]")
        rows = layout_LP.shape[0] if num_layers is None else num_layers
        check_layout_map(layout_LP, self.gpus, self.nodes, rows, num_experts)
        return self


def encode_layout_record(rec: LayoutRecord) -> dict[str, bytes | str | int]:
    """LayoutRecord -> stream entry fields (values redis-py can send as they are). ValueError when the record
    is one decode_layout_record would refuse (shape, sizes, ids, gpus, nodes, source, step, time)."""
    layout_LP = np.asarray(rec.layout_LP)
    if layout_LP.ndim != 2 or layout_LP.dtype.kind not in "iu":
        raise ValueError(f"layout_LP must be a 2-D int array [layers, slots], got "
                         f"{layout_LP.dtype} {layout_LP.shape}")
    if layout_LP.size and (layout_LP.min() < 0 or layout_LP.max() >= MAX_EXPERTS):
        raise ValueError(f"layout_LP must hold expert ids 0..{MAX_EXPERTS - 1}")
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
    0..MAX_EXPERTS - 1, gpus not dividing P, nodes not dividing gpus, an unknown source, or a number outside
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
    if layout_LP.min() < 0 or layout_LP.max() >= MAX_EXPERTS:
        raise ValueError(f"map holds expert ids outside 0..{MAX_EXPERTS - 1}")
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

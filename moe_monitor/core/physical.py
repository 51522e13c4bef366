"""PhysicalRecord: the tokens each physical slot served in one step on one rank, as the engine's balancer
dispatched them (SGLang's per_pass `global_physical_count`, vLLM's EPLB `expert_load_pass`), and its stream
encoding (the counts as raw little-endian int32 bytes, like a layout record's map).

Shape legend (README, Conventions): L MoE layers, P physical slots (slot p lives on GPU p // (P / gpus)).
One stream entry per (step, rank), never one per layer. An engine's rank counts the tokens it sends to every
slot of the cluster, so a step's measured GPU loads are the records of all its ranks summed, then each GPU's
slots summed: measured_gpu_loads(). The logical counts of the same step (the StepRecord) and the layout in
force give the load a policy would predict (core.dispatch); the two side by side say what the balancer won.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fields import _instance, _int, _raw, _text, _time, _version
from .keys import COUNTS_DTYPE, MAX_CELLS, MAX_LAYERS, MAX_SLOTS, MAX_STEP, MAX_WORLD, SCHEMA_VERSION, check_run_name

# Who measured the counts: "engine" an engine driving ExpertLoadMonitor.record_physical itself, "sglang" the
# SGLang bridge (per_pass dumps), "vllm" the vLLM plugin (EPLB's expert_load_pass), "runtime" the EP runtime.
PHYSICAL_SOURCES = ("engine", "sglang", "vllm", "runtime")
PHYSICAL_FIELDS = ("v", "run", "inst", "rank", "step", "t", "L", "P", "gpus", "source", "counts")
PHYSICAL_DTYPE = COUNTS_DTYPE  # little-endian int32


@dataclass(frozen=True)
class PhysicalRecord:
    """Tokens per physical slot of one step on one rank.

    counts_LP: int32 [L, P] tokens this rank dispatched to each physical slot (all >= 0); GPU of slot p is
    p // (P / gpus). step: the step id of the StepRecord it belongs to (same run, rank and instance).
    time_s: unix seconds of the step. source: one of PHYSICAL_SOURCES.
    """

    run: str
    step: int
    rank: int
    time_s: float
    counts_LP: np.ndarray
    gpus: int
    instance: str = ""
    source: str = "engine"

    @property
    def num_layers(self) -> int:
        return int(self.counts_LP.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.counts_LP.shape[1])

    def gpu_loads(self) -> np.ndarray:
        """int64 [L, G]: this record's tokens per GPU (each GPU's slots summed)."""
        counts = self.counts_LP.astype(np.int64)
        return counts.reshape(counts.shape[0], self.gpus, -1).sum(axis=2)


def check_physical_counts(counts_LP, gpus: int) -> np.ndarray:
    """counts_LP as a new int32 [L, P] array when it is a 2-D array of whole numbers 0..2**31 - 1 within the
    bounds of core/keys.py whose P splits evenly over gpus; ValueError (one, naming what is wrong) otherwise."""
    counts = np.asarray(counts_LP)
    if counts.ndim != 2 or counts.dtype.kind not in "iuf" or 0 in counts.shape:
        raise ValueError(f"physical counts must be a 2-D number array [layers, slots], got {counts.dtype} "
                         f"{counts.shape}")
    _check_shape(counts.shape[0], counts.shape[1], gpus)
    if counts.dtype.kind == "f" and not (np.isfinite(counts).all() and (counts == np.floor(counts)).all()):
        raise ValueError("physical counts must be whole numbers (no NaN, infinity or fractions)")
    if counts.min() < 0:
        raise ValueError("physical counts must not be negative")
    if counts.max() > np.iinfo(PHYSICAL_DTYPE).max:
        raise ValueError("a physical count exceeds int32 (more than 2**31 tokens in one slot and step)")
    return counts.astype(PHYSICAL_DTYPE)


def _check_shape(num_layers: int, num_slots: int, gpus: int) -> None:
    if not 1 <= num_layers <= MAX_LAYERS or not 1 <= num_slots <= MAX_SLOTS:
        raise ValueError(f"physical counts of {num_layers}x{num_slots} are outside 1..{MAX_LAYERS} layers, "
                         f"1..{MAX_SLOTS} slots")
    if num_layers * num_slots > MAX_CELLS:
        raise ValueError(f"physical counts of {num_layers}x{num_slots} exceed {MAX_CELLS} cells")
    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or not 1 <= gpus <= num_slots \
            or num_slots % gpus:
        raise ValueError(f"{num_slots} slots do not split evenly over gpus={gpus}")


def encode_physical(rec: PhysicalRecord) -> dict[str, bytes | str | int]:
    """PhysicalRecord -> stream entry fields (values redis-py can send as they are). ValueError when the record
    is one decode_physical would refuse (shape, negative or fractional counts, gpus, source, step, rank, time)."""
    counts = check_physical_counts(rec.counts_LP, rec.gpus)
    fields: dict[str, bytes | str | int] = {
        "v": SCHEMA_VERSION, "run": check_run_name(rec.run), "inst": rec.instance, "rank": int(rec.rank),
        "step": int(rec.step), "t": repr(float(rec.time_s)), "L": counts.shape[0], "P": counts.shape[1],
        "gpus": int(rec.gpus), "source": rec.source, "counts": np.ascontiguousarray(counts).tobytes(),
    }
    decode_physical(fields)  # one set of rules: what the reader would refuse is never written
    return fields


def decode_physical(fields: dict) -> PhysicalRecord:
    """Stream entry fields (bytes or str keys) -> PhysicalRecord. Raises ValueError (never another exception)
    on any malformed entry: wrong schema version, missing field, wrong byte length, a negative count, gpus not
    dividing P, an unknown source, or a number outside the bounds in core/keys.py (L <= MAX_LAYERS,
    P <= MAX_SLOTS, L x P <= MAX_CELLS, step < MAX_STEP, rank < MAX_WORLD, |t| < MAX_TIME_S, instance id <=
    MAX_NAME_CHARS)."""
    _version(fields, SCHEMA_VERSION)
    num_layers, num_slots = _int(fields, "L", 1, MAX_LAYERS + 1), _int(fields, "P", 1, MAX_SLOTS + 1)
    gpus = _int(fields, "gpus", 1, MAX_SLOTS + 1)
    _check_shape(num_layers, num_slots, gpus)
    raw = _raw(fields, "counts")
    if len(raw) != num_layers * num_slots * PHYSICAL_DTYPE.itemsize:
        raise ValueError(f"counts has {len(raw)} bytes, expected {num_layers}x{num_slots} int32")
    counts_LP = np.frombuffer(raw, dtype=PHYSICAL_DTYPE).reshape(num_layers, num_slots)
    if counts_LP.min() < 0:
        raise ValueError("counts holds negative values")
    source = _text(fields, "source", max_chars=16)
    if source not in PHYSICAL_SOURCES:
        raise ValueError(f"unknown physical-count source {source!r} (one of {PHYSICAL_SOURCES})")
    return PhysicalRecord(
        run=check_run_name(_text(fields, "run", max_chars=128)), step=_int(fields, "step", 0, MAX_STEP),
        rank=_int(fields, "rank", 0, MAX_WORLD), time_s=_time(fields, "t"), counts_LP=counts_LP, gpus=gpus,
        instance=_instance(fields), source=source)


def measured_gpu_loads(records) -> np.ndarray:
    """int64 [L, G]: the GPU loads of one step, its ranks' records summed (each GPU's slots summed). ValueError
    when records is empty or they disagree on [L, P] or gpus."""
    records = list(records)
    if not records:
        raise ValueError("no physical records to sum")
    shape = (records[0].counts_LP.shape, records[0].gpus)
    if any((rec.counts_LP.shape, rec.gpus) != shape for rec in records):
        raise ValueError("the physical records of one step disagree on [layers, slots] or gpus")
    return sum((rec.gpu_loads() for rec in records[1:]), records[0].gpu_loads())

"""Record batches of the step table -> wire.StepRecord, with the bounds of wire/keys.py on every row.

A row that breaks a bound (a step id out of range, rank >= world, a non-finite time, an unknown phase or
scope, negative counts, a sample of the wrong length or with ids outside [-1, E), a null where none is
allowed) is skipped and counted as a bad record, never raised; the caller's batch was already checked
against the schema (traces/schema.py), so counts have exactly L*E int32 per row.

Shape legend: R rows of a batch, L layers, E experts, N sampled tokens, K top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import wire


@dataclass
class Decoded:
    """What decode_rows read: the good records (row order) and how many rows were bad, with the last reason."""

    records: list[wire.StepRecord]
    bad_records: int = 0
    last_error: str = ""


def _ints(column: pa.Array, fill: int = -1) -> np.ndarray:
    return column.fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _texts(column: pa.Array) -> list[str | None]:
    if pa.types.is_dictionary(column.type):
        column = column.cast(pa.string())
    return column.to_pylist()


def counts_view(column: pa.Array, num_layers: int, num_experts: int) -> np.ndarray:
    """Zero-copy int32 view [R, L, E] of a counts column (fixed_size_binary of L*E*4 bytes); nulls read as 0
    (checked for separately)."""
    width = num_layers * num_experts * wire.COUNTS_DTYPE.itemsize
    if column.type.byte_width != width:
        raise ValueError(f"counts are {column.type.byte_width} bytes a row, expected {num_layers}x{num_experts} int32")
    data = column.buffers()[1]
    if data is None or len(column) == 0:
        return np.zeros((len(column), num_layers, num_experts), dtype=wire.COUNTS_DTYPE)
    raw = np.frombuffer(data, dtype=np.uint8, count=len(column) * width, offset=column.offset * width)
    return raw.view(wire.COUNTS_DTYPE).reshape(len(column), num_layers, num_experts)


def row_errors(batch: pa.RecordBatch, num_layers: int, num_experts: int) -> list[str]:
    """Per row: '' when it holds a valid step record, else the first reason it does not (vectorised checks)."""
    rows = batch.num_rows
    why = np.full(rows, "", dtype=object)

    def flag(bad, reason: str) -> None:
        why[(why == "") & bad] = reason

    for name in ("step", "rank", "world", "time_s", "phase", "tokens", "dropped", "instance", "scope", "counts",
                 "balancedness"):
        column = batch.column(name)
        if column.null_count:
            flag(column.is_null().to_numpy(zero_copy_only=False), f"{name} is null")
    step, rank, world = _ints(batch.column("step")), _ints(batch.column("rank")), _ints(batch.column("world"))
    flag((step < 0) | (step >= wire.MAX_STEP), "step id out of range")
    flag((world < 1) | (world > wire.MAX_WORLD), "world size out of range")
    flag((rank < 0) | (rank >= world), "rank is not below the world size")
    time_s = batch.column("time_s").fill_null(0.0).to_numpy(zero_copy_only=False)
    flag(~np.isfinite(time_s) | (np.abs(np.nan_to_num(time_s)) >= wire.MAX_TIME_S), "time is not finite or out of range")
    tokens, dropped = _ints(batch.column("tokens")), _ints(batch.column("dropped"))
    flag((tokens < 0) | (tokens >= wire.MAX_TOKENS), "tokens out of range")
    flag((dropped < 0) | (dropped >= wire.MAX_STEP), "dropped steps out of range")
    for name, allowed in (("phase", wire.PHASES), ("scope", wire.SCOPES)):
        texts = _texts(batch.column(name))
        flag(np.array([t not in allowed for t in texts], dtype=bool), f"unknown {name}")
    instances = _texts(batch.column("instance"))
    flag(np.array([t is not None and len(t) > wire.MAX_NAME_CHARS for t in instances], dtype=bool),
         "collector instance id too long")
    counts_RLE = counts_view(batch.column("counts"), num_layers, num_experts)
    flag((counts_RLE < 0).reshape(rows, -1).any(axis=1), "counts contain negative values")
    sample_col = batch.column("sample")
    has_sample = sample_col.is_valid().to_numpy(zero_copy_only=False)
    if has_sample.any():
        n, k = _ints(batch.column("sample_n")), _ints(batch.column("sample_k"))
        lengths = pc.binary_length(sample_col).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        bad_nk = has_sample & ((n < 0) | (n > wire.MAX_CELLS) | (k < 1) | (k > wire.MAX_EXPERTS))
        flag(bad_nk, "sample_n / sample_k out of range")
        expected = num_layers * np.clip(n, 0, wire.MAX_CELLS) * np.clip(k, 0, wire.MAX_EXPERTS) * wire.SAMPLE_DTYPE.itemsize
        flag(has_sample & (lengths != expected), "sample has the wrong byte length")
        flag(has_sample & (num_experts > wire.MAX_SAMPLE_EXPERTS), "sampled rows need E <= 32767")
    return list(why)


def decode_rows(batch: pa.RecordBatch, meta: wire.RunMeta, keep=None) -> Decoded:
    """The batch's rows as StepRecords (rows where keep [R] is True when given); bad rows counted."""
    num_layers, num_experts = len(meta.layer_names), meta.num_experts
    why = row_errors(batch, num_layers, num_experts)
    counts_RLE = counts_view(batch.column("counts"), num_layers, num_experts)
    cols = {name: batch.column(name) for name in batch.schema.names}
    step, rank, world = _ints(cols["step"]), _ints(cols["rank"]), _ints(cols["world"])
    tokens, dropped = _ints(cols["tokens"]), _ints(cols["dropped"])
    time_s = cols["time_s"].fill_null(0.0).to_numpy(zero_copy_only=False)
    phase, scope, instance = _texts(cols["phase"]), _texts(cols["scope"]), _texts(cols["instance"])
    samples = cols["sample"].to_pylist() if cols["sample"].null_count < len(cols["sample"]) else None
    n, k = _ints(cols["sample_n"]), _ints(cols["sample_k"])
    out = Decoded(records=[])
    for r in range(batch.num_rows):
        if keep is not None and not keep[r]:
            continue
        if why[r]:
            out.bad_records += 1
            out.last_error = f"step row {r}: {why[r]}"
            continue
        sample = None
        if samples is not None and samples[r] is not None:
            sample = np.frombuffer(samples[r], dtype=wire.SAMPLE_DTYPE).reshape(num_layers, int(n[r]), int(k[r]))
            if sample.size and ((sample < -1) | (sample >= num_experts)).any():
                out.bad_records += 1
                out.last_error = f"step row {r}: sample holds expert ids outside [-1, E)"
                continue
        out.records.append(wire.StepRecord(
            run=meta.run, rank=int(rank[r]), world_size=int(world[r]), step=int(step[r]), time_s=float(time_s[r]),
            phase=str(phase[r]), tokens=int(tokens[r]), counts_LE=counts_RLE[r].copy(), dropped_steps=int(dropped[r]),
            sample_ids_LNK=sample, instance=str(instance[r]), scope=str(scope[r])))
    return out

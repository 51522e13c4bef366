"""Record batches of the step table -> core.StepRecord, with the bounds of core/keys.py on every row.

A row that breaks a bound (a step id out of range, rank >= world, a non-finite time, an unknown phase or
scope, negative counts, a sample of the wrong length or with ids outside [-1, E), a null where none is
allowed) is skipped and counted as a bad record, never raised; the caller's batch was already checked
against the schema (core/tracefile/schema.py), so counts have exactly L*E int32 per row. The checks of a row's
place (step, rank, world, time, collector instance) and the zero-copy views of fixed-width binary columns
serve the timings table too (core/tracefile/timings.py). Nothing is expanded beyond what the rows kept need:
dictionary columns (phase, instance, scope; a .parquet trace's sample) are read through their dictionaries,
a sample is copied out of its column only for a row that is kept (core/tracefile/sample_column.py).

Shape legend: R rows of a batch, L layers, E experts, N sampled tokens, K top-k.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from moe_monitor import core

from .sample_column import SampleColumn


@dataclass
class Decoded:
    """What decode_rows read: the good records (row order) and how many rows were bad, with the last reason."""

    records: list[core.StepRecord]
    bad_records: int = 0
    last_error: str = ""


def as_ints(column: pa.Array, fill: int = -1) -> np.ndarray:
    """int64 [R] of an integer column, a null read as fill."""
    return column.fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def as_texts(column: pa.Array) -> list[str | None]:
    """A string or dictionary<string> column as a list (None for a null). A dictionary column is never
    expanded into strings: each row refers to its dictionary entry's one str (a long value repeated on many
    rows costs its length once)."""
    return list(text_objects(column))


def text_objects(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """object [R] of str (None for a null) of a string or dictionary<string> column, chunked or not; a
    dictionary's entries are decoded once per chunk and shared by the rows that use them."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [np.zeros(0, dtype=object)]
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            parts.append(np.asarray(chunk.to_pylist() + [None], dtype=object)[:-1])
            continue
        entries = np.asarray(chunk.dictionary.to_pylist() + [None], dtype=object)  # index -1: the None
        index = chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        parts.append(entries[np.where((index >= 0) & (index < len(entries) - 1), index, -1)])
    return np.concatenate(parts)


def fixed_width_view(column: pa.Array, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Zero-copy view [R, *shape] of a fixed_size_binary column whose rows are shape's values of dtype (the
    caller checked its byte width: prod(shape) * dtype.itemsize); a null row reads as whatever its slot holds."""
    width = math.prod(shape) * dtype.itemsize
    data = column.buffers()[1]
    if data is None or len(column) == 0:
        return np.zeros((len(column), *shape), dtype=dtype)
    raw = np.frombuffer(data, dtype=np.uint8, count=len(column) * width, offset=column.offset * width)
    return raw.view(dtype).reshape(len(column), *shape)


def counts_view(column: pa.Array, num_layers: int, num_experts: int) -> np.ndarray:
    """Zero-copy int32 view [R, L, E] of a counts column (fixed_size_binary of L*E*4 bytes); nulls read as 0
    (checked for separately)."""
    width = num_layers * num_experts * core.COUNTS_DTYPE.itemsize
    if column.type.byte_width != width:
        raise ValueError(f"counts are {column.type.byte_width} bytes a row, expected {num_layers}x{num_experts} int32")
    return fixed_width_view(column, core.COUNTS_DTYPE, (num_layers, num_experts))


class RowErrors:
    """Per row of a batch, the first reason it breaks a bound: why, object [R] ('' for a row with none yet)."""

    def __init__(self, rows: int):
        self.why = np.full(rows, "", dtype=object)

    def flag(self, bad: np.ndarray | np.bool_, reason: str) -> None:
        """reason for the rows where bad [R] holds that have no reason yet."""
        self.why[(self.why == "") & bad] = reason


def step_rank_errors(batch: pa.RecordBatch, columns: Sequence[str]) -> RowErrors:
    """The checks every table of one row per (step, rank) starts with, in this order: a null in one of columns,
    then the bounds of core/keys.py on step, world, rank (below world) and time_s."""
    errors = RowErrors(batch.num_rows)
    for name in columns:
        column = batch.column(name)
        if column.null_count:
            errors.flag(column.is_null().to_numpy(zero_copy_only=False), f"{name} is null")
    step, rank, world = as_ints(batch.column("step")), as_ints(batch.column("rank")), as_ints(batch.column("world"))
    errors.flag((step < 0) | (step >= core.MAX_STEP), "step id out of range")
    errors.flag((world < 1) | (world > core.MAX_WORLD), "world size out of range")
    errors.flag((rank < 0) | (rank >= world), "rank is not below the world size")
    time_s = batch.column("time_s").fill_null(0.0).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        errors.flag(~np.isfinite(time_s) | (np.abs(np.nan_to_num(time_s)) >= core.MAX_TIME_S),
                    "time is not finite or out of range")
    return errors


def long_instances(column: pa.Array) -> np.ndarray:
    """bool [R]: the row's collector instance id is longer than core.MAX_NAME_CHARS (a null is not)."""
    return np.array([t is not None and len(t) > core.MAX_NAME_CHARS for t in as_texts(column)], dtype=bool)


def row_errors(batch: pa.RecordBatch, num_layers: int, num_experts: int) -> list[str]:
    """Per row: '' when it holds a valid step record, else the first reason it does not (vectorised checks)."""
    rows = batch.num_rows
    errors = step_rank_errors(batch, ("step", "rank", "world", "time_s", "phase", "tokens", "dropped", "instance",
                                      "scope", "counts", "balancedness"))
    flag = errors.flag
    tokens, dropped = as_ints(batch.column("tokens")), as_ints(batch.column("dropped"))
    flag((tokens < 0) | (tokens >= core.MAX_TOKENS), "tokens out of range")
    flag((dropped < 0) | (dropped >= core.MAX_STEP), "dropped steps out of range")
    for name, allowed in (("phase", core.PHASES), ("scope", core.SCOPES)):
        texts = as_texts(batch.column(name))
        flag(np.array([t not in allowed for t in texts], dtype=bool), f"unknown {name}")
    flag(long_instances(batch.column("instance")), "collector instance id too long")
    counts_RLE = counts_view(batch.column("counts"), num_layers, num_experts)
    flag((counts_RLE < 0).reshape(rows, -1).any(axis=1), "counts contain negative values")
    samples = SampleColumn(batch.column("sample"))
    has_sample = samples.present_R
    if has_sample.any():
        n, k = as_ints(batch.column("sample_n")), as_ints(batch.column("sample_k"))
        lengths = samples.length_R
        bad_nk = has_sample & ((n < 0) | (n > core.MAX_CELLS) | (k < 1) | (k > core.MAX_EXPERTS))
        flag(bad_nk, "sample_n / sample_k out of range")
        expected = num_layers * np.clip(n, 0, core.MAX_CELLS) * np.clip(k, 0, core.MAX_EXPERTS) * core.SAMPLE_DTYPE.itemsize
        flag(has_sample & (lengths != expected), "sample has the wrong byte length")
        flag(has_sample & (num_experts > core.MAX_SAMPLE_EXPERTS), "sampled rows need E <= 32767")
    return list(errors.why)


def decode_rows(batch: pa.RecordBatch, meta: core.RunMeta, keep=None) -> Decoded:
    """The batch's rows as StepRecords (rows where keep [R] is True when given); bad rows counted."""
    num_layers, num_experts = len(meta.layer_names), meta.num_experts
    why = row_errors(batch, num_layers, num_experts)
    counts_RLE = counts_view(batch.column("counts"), num_layers, num_experts)
    cols = {name: batch.column(name) for name in batch.schema.names}
    step, rank, world = as_ints(cols["step"]), as_ints(cols["rank"]), as_ints(cols["world"])
    tokens, dropped = as_ints(cols["tokens"]), as_ints(cols["dropped"])
    time_s = cols["time_s"].fill_null(0.0).to_numpy(zero_copy_only=False)
    phase, scope, instance = as_texts(cols["phase"]), as_texts(cols["scope"]), as_texts(cols["instance"])
    samples = SampleColumn(cols["sample"])
    n, k = as_ints(cols["sample_n"]), as_ints(cols["sample_k"])
    out = Decoded(records=[])
    for r in range(batch.num_rows):
        if keep is not None and not keep[r]:
            continue
        if why[r]:
            out.bad_records += 1
            out.last_error = f"step row {r}: {why[r]}"
            continue
        sample = None
        if samples.present_R[r]:
            sample = samples.ids(r, num_layers, int(n[r]), int(k[r]))
            if sample.size and ((sample < -1) | (sample >= num_experts)).any():
                out.bad_records += 1
                out.last_error = f"step row {r}: sample holds expert ids outside [-1, E)"
                continue
        out.records.append(core.StepRecord(
            run=meta.run, rank=int(rank[r]), world_size=int(world[r]), step=int(step[r]), time_s=float(time_s[r]),
            phase=str(phase[r]), tokens=int(tokens[r]), counts_LE=counts_RLE[r].copy(), dropped_steps=int(dropped[r]),
            sample_ids_LNK=sample, instance=str(instance[r]), scope=str(scope[r])))
    return out

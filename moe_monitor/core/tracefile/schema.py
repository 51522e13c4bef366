"""The step table of the columnar traces, both ways: its schema and metadata (format version 1), records ->
record batches (step_batch, each step's balancedness computed on the way), record batches -> records checked
with the bounds of core/keys.py (decode_rows: a bad row is counted, never raised), and the rows-per-step bound
(check_rows_per_step). The writers, the columnar readers and the side tables (side.py) use it; the format is
described in docs/traces.md ("Format reference", "Inside the containers").

One row per (step, rank), STEP_COLUMNS: step int64, rank / world int32, time_s float64, phase / instance /
scope dictionary<string>, tokens / dropped int64, counts fixed_size_binary(L*E*4) = little-endian int32 [L, E],
sample binary = int16 [L, N, K] with sample_n / sample_k int32 (nullable), balancedness float64 (NaN: unknown).
Shape legend: R rows, T steps, L MoE layers, E logical experts, G GPUs, N sampled tokens, K top-k, D distinct.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moe_monitor import core
from moe_monitor.core.loadmodel import balancedness, gpu_weights, weighted_loads
from moe_monitor.core.timeline import LayoutTimeline

# ------------------------------------------------------------------ the schema and its metadata
FORMAT_NAME = "moe-trace"
FORMAT_VERSION = 1
META_FORMAT = b"moe.format"
META_VERSION = b"moe.format_version"
META_RUN = b"moe.run_meta"
META_LAYOUTS = b"moe.layouts"
META_SHAPE = b"moe.shape"
MAX_LAYOUTS_BYTES = 64 << 20  # layout records in the schema metadata (about 100 DeepSeek-V3 maps)

DICTIONARY_TEXT = pa.dictionary(pa.int32(), pa.string())  # the dictionary<string> columns
# the columns that place a row, first in the step table and in the timings table (side.py)
ROW_KEY_FIELDS = (pa.field("step", pa.int64(), nullable=False), pa.field("rank", pa.int32(), nullable=False),
                  pa.field("world", pa.int32(), nullable=False), pa.field("time_s", pa.float64(), nullable=False))
STEP_COLUMNS = ("step", "rank", "world", "time_s", "phase", "tokens", "dropped", "instance", "scope", "counts",
                "sample", "sample_n", "sample_k", "balancedness")


def step_schema(num_layers: int, num_experts: int, metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    """The step table's schema for counts [L, E] (sizes checked against core/keys.py)."""
    num_layers, num_experts, _ = core.check_sizes(num_layers, num_experts)
    return pa.schema([
        *ROW_KEY_FIELDS,
        pa.field("phase", DICTIONARY_TEXT, nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
        pa.field("dropped", pa.int64(), nullable=False),
        pa.field("instance", DICTIONARY_TEXT, nullable=False),
        pa.field("scope", DICTIONARY_TEXT, nullable=False),
        pa.field("counts", pa.binary(num_layers * num_experts * core.COUNTS_DTYPE.itemsize), nullable=False),
        pa.field("sample", pa.binary()),
        pa.field("sample_n", pa.int32()),
        pa.field("sample_k", pa.int32()),
        pa.field("balancedness", pa.float64(), nullable=False),
    ], metadata=metadata)


def schema_metadata(meta: core.RunMeta, layouts: list[core.LayoutRecord]) -> dict[bytes, bytes]:
    """The metadata of a trace's schema: format, version, the run metadata and the layout records so far."""
    lines = "\n".join(core.trace_line("layout", core.encode_layout_record(rec)) for rec in layouts)
    return {META_FORMAT: FORMAT_NAME.encode(), META_VERSION: str(FORMAT_VERSION).encode(),
            META_RUN: core.encode_meta(meta).encode(), META_LAYOUTS: lines.encode(),
            META_SHAPE: f"{len(meta.layer_names)},{meta.num_experts}".encode()}


def parse_metadata(schema: pa.Schema, raw: dict[bytes, bytes] | None = None
                   ) -> tuple[core.RunMeta, list[core.LayoutRecord], int]:
    """(run metadata, layout records, bad layout records) from a trace's schema (metadata from raw when given:
    a Parquet file's key-value metadata); ValueError with one clear message when it is not a trace of this
    format or version, or its columns differ from step_schema."""
    raw = (schema.metadata if raw is None else raw) or {}
    if raw.get(META_FORMAT) != FORMAT_NAME.encode():
        raise ValueError("not a MoE trace (its schema metadata lacks moe.format = moe-trace)")
    version = raw.get(META_VERSION, b"")
    if version != str(FORMAT_VERSION).encode():
        raise ValueError(f"trace format version {version[:20]!r} is not supported (this reader speaks "
                         f"{FORMAT_VERSION})")
    meta_json = raw.get(META_RUN)
    if meta_json is None:
        raise ValueError("trace schema metadata lacks the run metadata")
    meta = core.decode_meta(meta_json)  # bounded: MAX_META_BYTES, sizes checked before anything is built
    shape = (len(meta.layer_names), meta.num_experts)
    if raw.get(META_SHAPE) != f"{shape[0]},{shape[1]}".encode():
        raise ValueError(f"trace shape {raw.get(META_SHAPE, b'')[:40]!r} does not match the run metadata "
                         f"({shape[0]} layers x {shape[1]} experts)")
    want = step_schema(*shape)
    for field in want:
        index = schema.get_field_index(field.name)
        if index < 0:
            raise ValueError(f"trace lacks the column {field.name!r}")
        if not schema.field(index).type.equals(field.type):
            raise ValueError(f"trace column {field.name!r} is {schema.field(index).type}, expected {field.type}")
    layouts, bad = parse_layout_lines(raw.get(META_LAYOUTS, b""), meta)
    return meta, layouts, bad


def parse_layout_lines(text: bytes, meta: core.RunMeta) -> tuple[list[core.LayoutRecord], int]:
    """Layout records from JSON lines (core.trace_line("layout", ...)), each checked against the run's L and
    E; (records in step order, records that did not decode or fit)."""
    if len(text) > MAX_LAYOUTS_BYTES:
        raise ValueError(f"layout records take {len(text)} bytes of metadata, at most {MAX_LAYOUTS_BYTES}")
    out, bad = [], 0
    for line in text.split(b"\n"):
        if not line.strip():
            continue
        try:
            kind, rec = core.decode_trace_line(line.decode("utf-8"))
            if not isinstance(rec, core.LayoutRecord):
                raise ValueError(f"a {kind} line among the layout records")
            out.append(rec.validate(meta.num_experts, num_layers=len(meta.layer_names), unused=True))
        except (ValueError, UnicodeDecodeError):
            bad += 1
    return sorted(out, key=lambda rec: rec.step), bad


# ------------------------------------------------------------------ balancedness (computed when written)
class LayoutSchedule:
    """The layouts of a run in step order: the metadata's from the start, then each record from its step (the
    layout timeline, core.timeline)."""

    def __init__(self, meta: core.RunMeta, layouts: Sequence[core.LayoutRecord] = ()):
        self.num_experts = meta.num_experts
        self.gpus = meta.layout.gpus
        self._base = np.asarray(meta.layout.physical_to_logical_map, dtype=np.int64)
        self.num_layers = int(self._base.shape[0])
        self._changes: LayoutTimeline[np.ndarray] = LayoutTimeline(max_changes=1 << 20)
        self._weights: dict[int, np.ndarray] = {}
        for rec in sorted(layouts, key=lambda r: r.step):
            self.add(rec)

    def add(self, rec: core.LayoutRecord) -> None:
        """A layout record (already validated against the run): in force from rec.step on."""
        if rec.gpus != self.gpus or rec.num_layers != self.num_layers:
            return
        self._changes.add(rec.step, np.asarray(rec.layout_LP, dtype=np.int64))
        self._weights.clear()

    def segment_of(self, step_T: np.ndarray) -> np.ndarray:
        """int [T]: index of the layout in force at each step (-1: the metadata's)."""
        return self._changes.index_at(step_T)

    def weights(self, index: int) -> np.ndarray:
        """gpu_weights float32 [L, E, G] of layout `index` (-1: the metadata's)."""
        held = self._weights.get(index)
        if held is None:
            layout = self._base if index < 0 else self._changes.items[index]
            held = self._weights[index] = gpu_weights(layout, self.num_experts, self.gpus)
        return held


def step_balancedness(step_T: np.ndarray, counts_TLE: np.ndarray, schedule: LayoutSchedule) -> np.ndarray:
    """float64 [T]: each step's mean-over-layers balancedness (see the module docstring) from its counts
    [T, L, E] (ranks already summed) under the layout in force at step_T."""
    out = np.full(len(step_T), np.nan)
    if len(step_T) == 0:
        return out
    segment_T = schedule.segment_of(np.asarray(step_T, dtype=np.int64))
    for index in np.unique(segment_T):
        these = np.flatnonzero(segment_T == index)
        loads_TLG = weighted_loads(counts_TLE[these], schedule.weights(int(index)))
        eta_TL = balancedness(loads_TLG)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a step idle in every layer stays NaN
            out[these] = np.nanmean(eta_TL, axis=1)
    return out


def summed_by_step(step_R: np.ndarray, counts_RLE: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (step, rank) -> (distinct steps [T] ascending, counts summed over ranks int64 [T, L, E], index of
    each row's step [R])."""
    steps_T, row_step_R = np.unique(step_R, return_inverse=True)
    if len(steps_T) == len(step_R):  # one row per step (one rank): a reorder, no sums
        summed_TLE = np.empty(counts_RLE.shape, dtype=np.int64)
        summed_TLE[row_step_R] = counts_RLE
        return steps_T, summed_TLE, row_step_R
    summed = np.zeros((len(steps_T),) + counts_RLE.shape[1:], dtype=np.int64)
    np.add.at(summed, row_step_R, counts_RLE)
    return steps_T, summed, row_step_R


# ------------------------------------------------------------------ records -> record batches
def _dict_array(values: list[str]) -> pa.DictionaryArray:
    return pa.array(values, pa.string()).dictionary_encode().cast(pa.dictionary(pa.int32(), pa.string()))


def step_batch(records: Sequence[core.StepRecord], schema: pa.Schema, schedule: LayoutSchedule) -> pa.RecordBatch:
    """One record batch (rows in the order given) of the records; ValueError for a record of another shape
    or one core.encode_step refuses."""
    width = schema.field("counts").type.byte_width
    shape = (schedule.num_layers, schedule.num_experts)
    counts_RLE = np.empty((len(records),) + shape, dtype=core.COUNTS_DTYPE)
    samples: list[bytes | None] = []
    sample_n: list[int | None] = []
    sample_k: list[int | None] = []
    for i, rec in enumerate(records):
        core.encode_step(rec)  # the wire's own checks (phase, scope, shapes, sample ids)
        counts = np.asarray(rec.counts_LE)
        if counts.shape != shape:
            raise ValueError(f"step {rec.step} rank {rec.rank}: counts are {list(counts.shape)}, the trace holds "
                             f"{list(shape)} (layers x experts)")
        counts_RLE[i] = counts
        if rec.sample_ids_LNK is None:
            samples.append(None)
            sample_n.append(None)
            sample_k.append(None)
        else:
            sample = np.ascontiguousarray(rec.sample_ids_LNK, dtype=core.SAMPLE_DTYPE)
            samples.append(sample.tobytes())
            sample_n.append(sample.shape[1])
            sample_k.append(sample.shape[2])
    step_R = np.array([rec.step for rec in records], dtype=np.int64)
    eta_R = np.full(len(records), np.nan)
    if len(records):
        steps_T, summed_TLE, row_step_R = summed_by_step(step_R, counts_RLE)
        eta_T = step_balancedness(steps_T, summed_TLE, schedule)
        ranks_T = np.zeros(len(steps_T), dtype=np.int64)
        np.add.at(ranks_T, row_step_R, 1)
        world_T = np.zeros(len(steps_T), dtype=np.int64)
        world_T[row_step_R] = [rec.world_size for rec in records]
        eta_T[ranks_T < world_T] = np.nan  # not every rank of the step here: unknown
        eta_R = eta_T[row_step_R]
    flat = counts_RLE.reshape(len(records), -1).view(np.uint8).reshape(-1)
    counts = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(records), [None, pa.py_buffer(flat)])
    columns = [
        pa.array(step_R, pa.int64()),
        pa.array([rec.rank for rec in records], pa.int32()),
        pa.array([rec.world_size for rec in records], pa.int32()),
        pa.array([float(rec.time_s) for rec in records], pa.float64()),
        _dict_array([rec.phase for rec in records]),
        pa.array([rec.tokens for rec in records], pa.int64()),
        pa.array([rec.dropped_steps for rec in records], pa.int64()),
        _dict_array([rec.instance for rec in records]),
        _dict_array([rec.scope for rec in records]),
        counts,
        pa.array(samples, pa.binary()),
        pa.array(sample_n, pa.int32()),
        pa.array(sample_k, pa.int32()),
        pa.array(eta_R, pa.float64()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# ------------------------------------------------------------------ the sample column, row by row
class SampleColumn:
    """present_R: bool [R], the row has a sample; length_R: int64 [R], its bytes (0 without one)."""

    def __init__(self, column: pa.Array):
        rows = len(column)
        if pa.types.is_dictionary(column.type):
            self._values = column.dictionary
            index_R = column.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            self._values = column
            index_R = np.arange(rows, dtype=np.int64)
        valid_D = self._values.is_valid().to_numpy(zero_copy_only=False)
        length_D = pc.binary_length(self._values).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        ok_R = index_R >= 0
        safe_R = np.where(ok_R, index_R, 0)
        self._index_R = index_R
        self.present_R = ok_R & column.is_valid().to_numpy(zero_copy_only=False) & (
            valid_D[safe_R] if len(valid_D) else np.zeros(rows, dtype=bool))
        self.length_R = np.where(self.present_R, length_D[safe_R] if len(length_D) else 0, 0).astype(np.int64)

    def any(self) -> bool:
        return bool(self.present_R.any())

    def ids(self, r: int, num_layers: int, tokens: int, top_k: int) -> np.ndarray:
        """int16 [L, N, K] of row r (a copy; the caller checked that the row's length is L*N*K*2)."""
        value = self._values[int(self._index_R[r])].as_buffer()
        return np.frombuffer(value, dtype=core.SAMPLE_DTYPE).reshape(num_layers, tokens, top_k).copy()


# ------------------------------------------------------------------ record batches -> records, bounds checked
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


# ------------------------------------------------------------------ rows per step
MAX_INSTANCES_PER_STEP = 64


def _chunked_ints(column: pa.ChunkedArray) -> np.ndarray:
    return column.fill_null(-1).to_numpy().astype(np.int64, copy=False)


def instance_codes(column: pa.ChunkedArray) -> np.ndarray:
    """int64 [R]: one code per distinct collector instance id (-1 for a null) of a dictionary<string>
    column, its chunks' dictionaries unified first."""
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    unified = pa.chunked_array(column.chunks, type=column.type).unify_dictionaries()
    parts = [chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) for chunk in unified.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def check_rows_per_step(table: pa.Table) -> None:
    """ValueError naming the first step (by id) whose rows break the bound; table: the step, world and
    instance columns of every row of the trace."""
    step_R, world_R = _chunked_ints(table["step"]), _chunked_ints(table["world"])
    if not len(step_R):
        return
    code_R = instance_codes(table["instance"])
    order = np.lexsort((code_R, step_R))
    step_R, code_R, world_R = step_R[order], code_R[order], world_R[order]
    new_step_R = np.ones(len(step_R), dtype=bool)
    new_step_R[1:] = step_R[1:] != step_R[:-1]
    new_instance_R = new_step_R.copy()
    new_instance_R[1:] |= code_R[1:] != code_R[:-1]
    first_T = np.flatnonzero(new_step_R)
    rows_T = np.diff(np.append(first_T, len(step_R)))
    instances_T = np.add.reduceat(new_instance_R.astype(np.int64), first_T)
    world_T = np.maximum(np.minimum.reduceat(world_R, first_T), 1)
    bad_T = rows_T > world_T * np.minimum(instances_T, MAX_INSTANCES_PER_STEP)
    if bad_T.any():
        t = int(np.argmax(bad_T))
        raise ValueError(f"step {int(step_R[first_T[t]])} holds {int(rows_T[t])} rows from {int(instances_T[t])} "
                         f"collector instance(s) in a world of {int(world_T[t])}: at most the world size per "
                         f"instance (of at most {MAX_INSTANCES_PER_STEP}) is a trace")

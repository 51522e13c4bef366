"""What a trace keeps beside its step table, as tables of their own: NVML samples (core.GpuSample), layer timings
(core.TimingRecord) and physical-slot counts (core.PhysicalRecord): their schemas, records <-> record batches
with the bounds of core/keys.py (a bad row is counted, never raised), the Parquet sidecars of a .parquet trace
(<stem>.gpu.parquet, <stem>.timings.parquet, <stem>.physical.parquet) and the names of every sidecar (an .arrows
recording's <path>.side.jsonl is read by jsonl.py). The writers and the readers use it; formats in
docs/traces.md ("Containers", "Layer timings", "Other tools' files").

Shape legend (README, Conventions): R rows, L MoE layers (the run's, len(meta.layer_names)), P the four phases
of core.TIMING_PHASES for timings (dispatch, compute, combine, layer) or the physical slots for physical counts.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moe_monitor import core
from moe_monitor.core.budget import check_decoded, decoded_budget_bytes
from moe_monitor.core.physical import PHYSICAL_DTYPE

from .schema import (
    DICTIONARY_TEXT,
    META_FORMAT,
    META_VERSION,
    ROW_KEY_FIELDS,
    as_ints,
    as_texts,
    fixed_width_view,
    long_instances,
    step_rank_errors,
)

# ------------------------------------------------------------------ where a trace's side files lie
SIDE_SUFFIX = ".side.jsonl"


def side_path(path: str) -> str:
    """The side file of the .arrows file at path (JSON lines: late layouts, NVML samples, timing lines)."""
    return path + SIDE_SUFFIX


def gpu_sidecar(path: str | os.PathLike[str]) -> Path:
    """<stem>.gpu.parquet beside a .parquet trace."""
    p = Path(path)
    return p.with_name(p.name[:-len(".parquet")] + ".gpu.parquet" if p.name.endswith(".parquet") else p.name + ".gpu.parquet")


# ------------------------------------------------------------------ NVML samples: one row per sample
# gpus: the JSON list of per-GPU readings exactly as core.encode_gpu_sample writes it (fields core.GPU_FIELDS);
# rows decode through core.decode_gpu_sample, with its bounds
GPU_SCHEMA = pa.schema([
    pa.field("time_s", pa.float64(), nullable=False),
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("host", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("gpus", pa.string(), nullable=False),
])
MAX_GPU_ROWS = 1 << 22  # NVML samples read from one trace (two a second for three weeks)


def gpu_table(samples: Sequence[core.GpuSample]) -> pa.Table:
    """The samples as a GPU_SCHEMA table (each checked by core.encode_gpu_sample)."""
    encoded = [core.encode_gpu_sample(s) for s in samples]
    return pa.table({
        "time_s": pa.array([float(s.time_s) for s in samples], pa.float64()),
        "rank": pa.array([int(s.rank) for s in samples], pa.int32()),
        "host": pa.array([s.host for s in samples], pa.string()),
        "status": pa.array([s.status for s in samples], pa.string()),
        "reason": pa.array([s.reason for s in samples], pa.string()),
        "gpus": pa.array([str(e["gpus"]) for e in encoded], pa.string()),
    }, schema=GPU_SCHEMA)


def check_gpu_schema(schema: pa.Schema) -> None:
    for field_ in GPU_SCHEMA:
        index = schema.get_field_index(field_.name)
        if index < 0 or not schema.field(index).type.equals(field_.type):
            raise ValueError(f"GPU sample table lacks the column {field_.name!r} of type {field_.type}")


def gpu_samples_of(table: pa.Table) -> tuple[list[core.GpuSample], int, str]:
    """(samples in row order, bad rows, last reason) of a GPU_SCHEMA table."""
    out: list[core.GpuSample] = []
    bad, last = 0, ""
    for row in table.to_pylist():
        try:
            if row["time_s"] is None:
                raise ValueError("time is null")
            out.append(core.decode_gpu_sample({"v": core.SCHEMA_VERSION, "rank": row["rank"], "host": row["host"],
                                               "t": repr(float(row["time_s"])), "status": row["status"],
                                               "reason": row["reason"], "gpus": row["gpus"]}))
        except ValueError as exc:
            bad, last = bad + 1, f"GPU sample: {exc}"
    return out, bad, last


class GpuSamples:
    """NVML samples read from beside a trace (a GPU sidecar, an .arrows side file), bad ones counted."""

    def __init__(self) -> None:
        self.samples: list[core.GpuSample] = []
        self.bad_records = 0
        self.last_error = ""

    def bad(self, why: str) -> None:
        self.bad_records += 1
        self.last_error = why

    def samples_between(self, t0_s: float, t1_s: float) -> list[core.GpuSample]:
        picked = [s for s in self.samples if t0_s <= s.time_s <= t1_s]
        return sorted(picked, key=lambda s: s.time_s)


def read_gpu_parquet(path: str) -> GpuSamples:
    """The NVML samples of a <stem>.gpu.parquet sidecar (absent: none)."""
    out = GpuSamples()
    if not os.path.isfile(path):
        return out
    try:
        pf = pq.ParquetFile(path, memory_map=True)
        check_gpu_schema(pf.schema_arrow)
        if pf.metadata.num_rows > MAX_GPU_ROWS:
            raise ValueError(f"{pf.metadata.num_rows} NVML samples, at most {MAX_GPU_ROWS} are read")
        out.samples, out.bad_records, out.last_error = gpu_samples_of(
            pf.read(columns=["time_s", "rank", "host", "status", "reason", "gpus"]))
    except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
        out.bad(f"{os.path.basename(path)}: {str(exc)[:200]}")
    return out


# ------------------------------------------------------------------ layer timings: one row per (step, rank)
# .parquet: the sidecar <stem>.timings.parquet, its row count in the trace's metadata (META_TIMING_ROWS);
# .arrows / .jsonl: "timing" lines (jsonl.py: TimingLines). The four float32 [L] arrays are raw bytes like the
# counts (zero-copy float32 [R, L] views, NaN bits kept); a measured time is finite, >= 0, < core.MAX_PHASE_S.
TIMING_FORMAT = "moe-trace-timings"
TIMING_FORMAT_VERSION = 1
META_LAYERS = b"moe.layers"
META_TIMING_ROWS = b"moe.timing_rows"  # in the .parquet trace's own metadata: rows written to its sidecar
TIMING_ARRAYS = ("dispatch_s_L", "compute_s_L", "combine_s_L", "layer_s_L")  # core.TIMING_PHASES order
TIMING_COLUMNS = ("step", "rank", "world", "time_s", "instance", *TIMING_ARRAYS)
TIMING_DTYPE = np.dtype("<f4")
TIMING_GROUP_ROWS = 2048  # rows per row group of the sidecar (about 2 MB at L = 58)
ZSTD_LEVEL = 3
MAX_TIMING_GROUP_BYTES = 1 << 30  # a row group a reader takes at once (declared rows x row width)
MAX_TIMING_READ_BYTES = 4 << 30   # the float32 arrays one read_timings call may return


def timings_sidecar(path: str | os.PathLike[str]) -> Path:
    """<stem>.timings.parquet beside a .parquet trace."""
    p = Path(path)
    stem = p.name[:-len(".parquet")] if p.name.endswith(".parquet") else p.name
    return p.with_name(stem + ".timings.parquet")


def timing_schema(num_layers: int) -> pa.Schema:
    """The timings table's schema for [L] arrays, with its metadata (format, version, L)."""
    if not 1 <= int(num_layers) <= core.MAX_LAYERS:
        raise ValueError(f"timings need 1..{core.MAX_LAYERS} layers, got {num_layers}")
    width = int(num_layers) * TIMING_DTYPE.itemsize
    return pa.schema([
        *ROW_KEY_FIELDS,
        pa.field("instance", DICTIONARY_TEXT, nullable=False),
        *(pa.field(name, pa.binary(width), nullable=False) for name in TIMING_ARRAYS),
    ], metadata={META_FORMAT: TIMING_FORMAT.encode(), META_VERSION: str(TIMING_FORMAT_VERSION).encode(),
                 META_LAYERS: str(int(num_layers)).encode()})


def check_timing_schema(schema: pa.Schema, num_layers: int) -> None:
    """ValueError (one line) when schema is not a timings table of this version for L = num_layers."""
    raw = schema.metadata or {}
    if raw.get(META_FORMAT) != TIMING_FORMAT.encode():
        raise ValueError(f"not a timings table (its metadata lacks moe.format = {TIMING_FORMAT})")
    if raw.get(META_VERSION) != str(TIMING_FORMAT_VERSION).encode():
        raise ValueError(f"timings table version {raw.get(META_VERSION, b'')[:20]!r} is not supported "
                         f"(this reader speaks {TIMING_FORMAT_VERSION})")
    want = timing_schema(num_layers)
    for field_ in want:
        index = schema.get_field_index(field_.name)
        if index < 0:
            raise ValueError(f"timings table lacks the column {field_.name!r}")
        if not schema.field(index).type.equals(field_.type):
            raise ValueError(f"timings column {field_.name!r} is {schema.field(index).type}, expected {field_.type} "
                             f"({num_layers} layers)")


def times_view(column: pa.Array, num_layers: int) -> np.ndarray:
    """Zero-copy float32 view [R, L] of a fixed_size_binary(L*4) column (nulls read as whatever their slot
    holds: checked separately)."""
    width = num_layers * TIMING_DTYPE.itemsize
    if column.type.byte_width != width:
        raise ValueError(f"timings are {column.type.byte_width} bytes a row, expected {num_layers} float32")
    return fixed_width_view(column, TIMING_DTYPE, (num_layers,))


def timing_row_errors(batch: pa.RecordBatch, num_layers: int) -> np.ndarray:
    """object [R]: '' for a row that holds a valid timing record, else the first reason it does not (the bounds
    of core.decode_timing, vectorised)."""
    errors = step_rank_errors(batch, TIMING_COLUMNS)
    errors.flag(long_instances(batch.column("instance")), "collector instance id too long")
    for name, phase in zip(TIMING_ARRAYS, core.TIMING_PHASES):
        times_RL = times_view(batch.column(name), num_layers)
        with np.errstate(invalid="ignore"):
            bad = ~np.isnan(times_RL) & ~((times_RL >= 0) & (times_RL < core.MAX_PHASE_S))
        errors.flag(bad.any(axis=1), f"{phase} times must be NaN (not measured) or finite, >= 0 and below "
                                     f"{core.MAX_PHASE_S:g} s")
    return errors.why


@dataclass
class TimingRead:
    """What one read of timings found: the good records and the rows or lines that were bad, with the last
    reason."""

    records: list[core.TimingRecord] = field(default_factory=list)
    bad_records: int = 0
    last_error: str = ""

    def bad(self, why: str, count: int = 1) -> None:
        self.bad_records += count
        self.last_error = why


def decode_timing_rows(batch: pa.RecordBatch, meta: core.RunMeta, first_step: int, last_step: int,
                       out: TimingRead) -> None:
    """The rows of batch (TIMING_SCHEMA, L = the run's layers) with first_step <= step <= last_step, as
    TimingRecords of run meta.run appended to out.records (row order); bad rows counted in out. Each record's
    four float32 [L] arrays are read-only views of one copied float32 [R, P, L] block."""
    num_layers = len(meta.layer_names)
    step = as_ints(batch.column("step"))
    keep = (step >= first_step) & (step <= last_step)
    if not keep.any():
        return
    why = timing_row_errors(batch, num_layers)
    bad = keep & (why != "")
    if bad.any():
        out.bad(f"timing row {int(np.flatnonzero(bad)[-1])}: {why[bad][-1]}", int(bad.sum()))
    rows = np.flatnonzero(keep & (why == ""))
    if not len(rows):
        return
    block_RPL = np.stack([times_view(batch.column(name), num_layers)[rows] for name in TIMING_ARRAYS], axis=1)
    block_RPL.flags.writeable = False
    rank, world = as_ints(batch.column("rank"))[rows], as_ints(batch.column("world"))[rows]
    time_s = batch.column("time_s").to_numpy(zero_copy_only=False)[rows]
    texts = as_texts(batch.column("instance"))
    for i, r in enumerate(rows):
        out.records.append(core.TimingRecord(
            run=meta.run, rank=int(rank[i]), world_size=int(world[i]), step=int(step[r]), time_s=float(time_s[i]),
            dispatch_s_L=block_RPL[i, 0], compute_s_L=block_RPL[i, 1], combine_s_L=block_RPL[i, 2],
            layer_s_L=block_RPL[i, 3], instance=str(texts[r])))


def timing_batch(records: Sequence[core.TimingRecord], schema: pa.Schema) -> pa.RecordBatch:
    """One record batch (rows in the order given) of the records; ValueError naming the first record that is
    not [L] of the schema's L or breaks a bound a reader would refuse it for (a writer never writes those)."""
    width = schema.field("layer_s_L").type.byte_width
    num_layers = width // TIMING_DTYPE.itemsize
    block_PRL = np.empty((len(TIMING_ARRAYS), len(records), num_layers), dtype=TIMING_DTYPE)
    for i, rec in enumerate(records):
        for p, times in enumerate(rec.arrays()):
            times_L = np.asarray(times)
            if times_L.shape != (num_layers,):
                raise ValueError(f"timings of step {rec.step} rank {rec.rank}: {TIMING_ARRAYS[p]} is "
                                 f"{list(times_L.shape)}, the trace holds [{num_layers}] (layers)")
            block_PRL[p, i] = times_L
    arrays = [pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(records),
                                                   [None, pa.py_buffer(block_PRL[p].reshape(-1).view(np.uint8))])
              for p in range(len(TIMING_ARRAYS))]
    instances = pa.array([rec.instance for rec in records], pa.string()).dictionary_encode().cast(DICTIONARY_TEXT)
    batch = pa.RecordBatch.from_arrays([
        pa.array([rec.step for rec in records], pa.int64()),
        pa.array([rec.rank for rec in records], pa.int32()),
        pa.array([rec.world_size for rec in records], pa.int32()),
        pa.array([float(rec.time_s) for rec in records], pa.float64()),
        instances, *arrays], schema=schema)
    why = timing_row_errors(batch, num_layers)
    bad = np.flatnonzero(why != "")
    if len(bad):
        rec = records[int(bad[0])]
        raise ValueError(f"timings of step {rec.step} rank {rec.rank}: {why[bad[0]]}")
    return batch


def check_read_size(rows: int, num_layers: int, first_step: int, last_step: int) -> None:
    if rows * num_layers * len(TIMING_ARRAYS) * TIMING_DTYPE.itemsize > MAX_TIMING_READ_BYTES:
        raise ValueError(f"steps {first_step}..{last_step} hold more than {MAX_TIMING_READ_BYTES >> 30} GiB of layer "
                         "timings: read a shorter range")


class TimingTableWriter:
    """Writes the timings sidecar of a .parquet trace: rows buffered into row groups of TIMING_GROUP_ROWS,
    under a hidden temporary name, renamed into place by close() (a sidecar that exists is whole); close()
    with no row written removes a sidecar left from an earlier file of that name."""

    def __init__(self, path: str | os.PathLike[str], num_layers: int):
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.part")
        self.schema = timing_schema(num_layers)
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self.rows = 0

    def write(self, records: Sequence[core.TimingRecord]) -> None:
        """Append records (ValueError, nothing appended, when one does not fit: timing_batch)."""
        if not records:
            return
        self._pending.append(timing_batch(records, self.schema))
        self._pending_rows += len(records)
        self.rows += len(records)
        if self._pending_rows >= TIMING_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd", compression_level=ZSTD_LEVEL,
                                            write_statistics=["step"], use_dictionary=["instance"])
        self._writer.write_table(pa.Table.from_batches(self._pending, self.schema), row_group_size=TIMING_GROUP_ROWS)
        self._pending, self._pending_rows = [], 0

    def close(self) -> int:
        """Finish the sidecar (or remove a stale one when no row was written); the rows written."""
        self._flush()
        if self._writer is None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return 0
        self._writer.close()
        os.replace(self._tmp, self.path)
        return self.rows

    def abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._tmp.unlink(missing_ok=True)


class TimingTable:
    """The timings sidecar of a .parquet trace, for reading: opened and checked at construction (schema, L,
    the rows the trace says it wrote), its row groups indexed by their step statistics; read(first, last)
    reads only the row groups that overlap (the last one read is kept: a forward replay reads it again). Every problem is a bad record with one message naming the file
    (bad_records, last_error), never an exception: the trace's steps read without the timings."""

    def __init__(self, path: str | os.PathLike[str], meta: core.RunMeta, expected_rows: int | None):
        self.path = Path(path)
        self.meta = meta
        self.rows = 0
        self.bad_records = 0
        self.last_error = ""
        self._file: pq.ParquetFile | None = None
        self._groups: list[tuple[int, int, int]] = []  # (row group, first step, last step)
        self._held: tuple[int, pa.Table] | None = None  # the row group read last (a replay reads it again)
        if not self.path.is_file():
            if expected_rows:
                self._bad(f"is missing (the trace was written with {expected_rows} timing rows)")
            return
        if expected_rows == 0:
            return  # a file left from another trace of that name: this one wrote no timings
        try:
            self._open(expected_rows)
        except (OSError, ValueError, pa.ArrowException) as exc:  # ArrowInvalid is a ValueError
            self._file, self._groups, self.rows = None, [], 0
            self._bad(str(exc)[:200].rstrip(". "))

    def _bad(self, why: str) -> None:
        self.bad_records += 1
        self.last_error = f"layer timings {self.path.name}: {why}; the steps read without them"

    def _open(self, expected_rows: int | None) -> None:
        num_layers = len(self.meta.layer_names)
        pf = pq.ParquetFile(self.path, memory_map=True)
        check_timing_schema(pf.schema_arrow, num_layers)
        meta = pf.metadata
        if expected_rows is not None and meta.num_rows != expected_rows:
            raise ValueError(f"holds {meta.num_rows} rows, the trace wrote {expected_rows} (cut short or another "
                             "trace's)")
        width = len(TIMING_ARRAYS) * num_layers * TIMING_DTYPE.itemsize + 64
        check_decoded(f"{self.path.name}: its {meta.num_rows} timing rows", meta.num_rows * width,
                      decoded_budget_bytes())  # the whole sidecar, before any row group is read
        step_index = pf.schema_arrow.get_field_index("step")
        groups = []
        for group in range(meta.num_row_groups):
            info = meta.row_group(group)
            if info.num_rows * width > MAX_TIMING_GROUP_BYTES or info.total_byte_size > 2 * MAX_TIMING_GROUP_BYTES:
                raise ValueError(f"row group {group} declares {info.num_rows} rows ({info.total_byte_size} bytes), "
                                 "more than a reader takes at once")
            stats = info.column(step_index).statistics
            if stats is not None and stats.has_min_max:
                first, last = int(stats.min), int(stats.max)
            else:
                steps = as_ints(pf.read_row_group(group, columns=["step"])["step"].combine_chunks())
                first, last = (int(steps.min()), int(steps.max())) if len(steps) else (0, -1)
            groups.append((group, first, last))
        self._file, self._groups, self.rows = pf, groups, int(meta.num_rows)

    def read(self, first_step: int, last_step: int) -> TimingRead:
        """The good rows with first_step <= step <= last_step (file order), bad rows counted in the result."""
        out = TimingRead()
        if self._file is None:
            return out
        wanted = [g for g in self._groups if g[2] >= first_step and g[1] <= last_step]
        meta = self._file.metadata
        check_read_size(sum(meta.row_group(g[0]).num_rows for g in wanted), len(self.meta.layer_names),
                        first_step, last_step)
        for group, _, _ in wanted:
            try:
                if self._held is None or self._held[0] != group:
                    self._held = None
                    self._held = (group, self._file.read_row_group(group).combine_chunks())
                for batch in self._held[1].to_batches():
                    decode_timing_rows(batch, self.meta, first_step, last_step, out)
            except (OSError, ValueError, pa.ArrowException) as exc:  # a damaged row group: one bad record, once
                self._groups = [g for g in self._groups if g[0] != group]
                self._bad(f"row group {group} does not read ({str(exc)[:160].rstrip('. ')})")
                out.bad(self.last_error)
        return out

    def close(self) -> None:
        self._held = None
        if self._file is not None:
            self._file.close()
            self._file = None


# ------------------------------------------------------------------ physical-slot counts: one row per (step, rank)
# The sidecar <stem>.physical.parquet (`moe-monitor convert` of inputs that measure them: UltraEP's
# post_physical_loads); counts int32 [L, P], slot p on GPU p // (P / gpus); L, P, gpus in the metadata. Rows are
# checked by core.decode_physical's rules; their declared bytes count against the budget before a page is read.
PHYSICAL_FORMAT = "moe-trace-physical"
PHYSICAL_FORMAT_VERSION = 1
META_PHYSICAL_SHAPE = b"moe.physical_shape"  # "L,P,gpus"
PHYSICAL_GROUP_ROWS = 256
PHYSICAL_ROW_FIXED_BYTES = 8 + 4 + 8 + 2 * 4  # step, rank, time_s and two dictionary indices


@dataclass
class PhysicalRead:
    """What one read found: the good records (step order) and the bad rows, with the last reason."""

    records: list[core.PhysicalRecord] = field(default_factory=list)
    bad_records: int = 0
    last_error: str = ""


def physical_sidecar(path: str | os.PathLike[str]) -> Path:
    """<stem>.physical.parquet beside a .parquet trace, <name>.physical.parquet beside another."""
    p = Path(path)
    stem = p.name[:-len(".parquet")] if p.name.endswith(".parquet") else p.name
    return p.with_name(stem + ".physical.parquet")


def physical_schema(num_layers: int, num_slots: int, gpus: int) -> pa.Schema:
    return pa.schema([
        pa.field("step", pa.int64(), nullable=False), pa.field("rank", pa.int32(), nullable=False),
        pa.field("time_s", pa.float64(), nullable=False), pa.field("instance", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("counts", pa.binary(num_layers * num_slots * PHYSICAL_DTYPE.itemsize), nullable=False),
    ], metadata={META_FORMAT: PHYSICAL_FORMAT.encode(), META_VERSION: str(PHYSICAL_FORMAT_VERSION).encode(),
                 META_PHYSICAL_SHAPE: f"{num_layers},{num_slots},{gpus}".encode()})


def write_physical(trace_path: str | os.PathLike[str], records: Sequence[core.PhysicalRecord]) -> int:
    """Write records (any order; sorted by step, rank) as the sidecar of trace_path, replacing one there; none:
    remove a stale one. Returns the rows written. ValueError for a record core.encode_physical refuses, or
    records of different [L, P] or gpus."""
    side = physical_sidecar(trace_path)
    if not records:
        with contextlib.suppress(FileNotFoundError):
            side.unlink()
        return 0
    first = records[0]
    shape = (first.num_layers, first.num_slots, first.gpus)
    rows = sorted(records, key=lambda r: (r.step, r.rank, r.instance))
    for rec in rows:
        core.encode_physical(rec)
        if (rec.num_layers, rec.num_slots, rec.gpus) != shape:
            raise ValueError(f"physical counts of step {rec.step} are {rec.num_layers}x{rec.num_slots} on {rec.gpus} "
                             f"GPUs, the first record's {shape[0]}x{shape[1]} on {shape[2]}")
    schema = physical_schema(*shape)
    tmp = side.with_name(f".{side.name}.part")
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for a in range(0, len(rows), PHYSICAL_GROUP_ROWS):
                writer.write_table(pa.Table.from_batches([_physical_batch(rows[a:a + PHYSICAL_GROUP_ROWS], schema)]))
        os.replace(tmp, side)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(rows)


def _physical_batch(records: Sequence[core.PhysicalRecord], schema: pa.Schema) -> pa.RecordBatch:
    width = schema.field("counts").type.byte_width
    block = np.stack([np.ascontiguousarray(r.counts_LP, dtype=PHYSICAL_DTYPE) for r in records])
    counts = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(records),
                                                  [None, pa.py_buffer(block.reshape(-1).view(np.uint8))])
    return pa.RecordBatch.from_arrays([
        pa.array([r.step for r in records], pa.int64()), pa.array([r.rank for r in records], pa.int32()),
        pa.array([float(r.time_s) for r in records], pa.float64()),
        pa.array([r.instance for r in records], pa.string()), pa.array([r.source for r in records], pa.string()),
        counts], schema=schema)


def read_physical(trace_path: str | os.PathLike[str], run: str, budget_bytes: int) -> PhysicalRead:
    """The physical records (of run `run`) in the sidecar of trace_path; an empty read when there is none.
    ValueError (one line naming the sidecar) for a file that is not one, or declares more than budget_bytes."""
    side = physical_sidecar(trace_path)
    out = PhysicalRead()
    if not side.is_file():
        return out
    try:
        pf = pq.ParquetFile(side, memory_map=True)
        num_layers, num_slots, gpus = _check_physical_schema(pf.schema_arrow)
        width = num_layers * num_slots * PHYSICAL_DTYPE.itemsize
        declared = pf.metadata.num_rows * (width + PHYSICAL_ROW_FIXED_BYTES)
        for g in range(pf.metadata.num_row_groups):
            info = pf.metadata.row_group(g)
            for j in range(info.num_columns):
                chunk = info.column(j)
                if chunk.path_in_schema in ("instance", "source"):
                    declared += max(0, chunk.total_uncompressed_size)
        check_decoded(f"{side.name}: its rows", declared, budget_bytes)
        for g in range(pf.metadata.num_row_groups):
            _decode_physical(pf.read_row_group(g), run, num_layers, num_slots, gpus, out)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"{side.name}: cannot be read ({type(exc).__name__}: {str(exc)[:160]})") from None
    except ValueError as exc:
        raise ValueError(str(exc) if str(exc).startswith(side.name) else f"{side.name}: {str(exc)[:200]}") from None
    out.records.sort(key=lambda r: (r.step, r.rank, r.instance))
    return out


def _check_physical_schema(schema: pa.Schema) -> tuple[int, int, int]:
    raw = schema.metadata or {}
    if raw.get(META_FORMAT) != PHYSICAL_FORMAT.encode():
        raise ValueError(f"not a physical-counts table (its metadata lacks moe.format = {PHYSICAL_FORMAT})")
    if raw.get(META_VERSION) != str(PHYSICAL_FORMAT_VERSION).encode():
        raise ValueError(f"physical-counts table version {raw.get(META_VERSION, b'')[:20]!r} is not supported")
    try:
        num_layers, num_slots, gpus = (int(x) for x in raw.get(META_PHYSICAL_SHAPE, b"").decode().split(","))
    except ValueError:
        raise ValueError("the physical-counts table lacks its shape (moe.physical_shape = L,P,gpus)") from None
    if not (1 <= num_layers <= core.MAX_LAYERS and 1 <= num_slots <= core.MAX_SLOTS
            and num_layers * num_slots <= core.MAX_CELLS and 1 <= gpus <= num_slots and num_slots % gpus == 0):
        raise ValueError(f"physical counts of {num_layers}x{num_slots} on {gpus} GPUs are outside the bounds of "
                         f"core/keys.py")
    for f in physical_schema(num_layers, num_slots, gpus):
        index = schema.get_field_index(f.name)
        if index < 0 or not schema.field(index).type.equals(f.type):
            raise ValueError(f"the physical-counts column {f.name!r} is missing or not {f.type}")
    return num_layers, num_slots, gpus


def _decode_physical(table: pa.Table, run: str, num_layers: int, num_slots: int, gpus: int, out: PhysicalRead) -> None:
    cols = {name: table.column(name).to_pylist() for name in ("step", "rank", "time_s", "instance", "source")}
    counts = table.column("counts").combine_chunks()
    for i in range(table.num_rows):
        fields = {"v": core.SCHEMA_VERSION, "run": run, "inst": cols["instance"][i], "rank": cols["rank"][i],
                  "step": cols["step"][i], "t": repr(cols["time_s"][i]), "L": num_layers, "P": num_slots,
                  "gpus": gpus, "source": cols["source"][i], "counts": counts[i].as_py()}
        try:
            out.records.append(core.decode_physical(fields))
        except ValueError as exc:
            out.bad_records += 1
            out.last_error = f"physical row {i}: {exc}"

"""Layer timings (core.TimingRecord) in traces: one row per (step, rank) of an engine that times its MoE layers.

Shape legend (README, Conventions): L MoE layers (the run's, len(meta.layer_names)), R rows, P the four
phases of core.TIMING_PHASES (dispatch, compute, combine, layer), in that order.

Where they are kept:
    .parquet   the sidecar <stem>.timings.parquet (TIMING_SCHEMA below, zstd, row groups of TIMING_GROUP_ROWS
               rows with step statistics), written beside the trace like the NVML sidecar; the trace's own
               key-value metadata counts the rows it wrote (META_TIMING_ROWS), so a missing or cut sidecar is
               told from a run without timings
    .arrows    "timing" lines (core.trace_line) of the side file <path>.side.jsonl
    .jsonl     "timing" lines of the trace itself

Timings table columns (TIMING_SCHEMA; the same content and bounds as core.TimingRecord, core/timings.py):

    step          int64      the step id of the StepRecord it belongs to (0 <= step < core.MAX_STEP)
    rank          int32      0 <= rank < world
    world         int32      ranks of the run (1 <= world <= core.MAX_WORLD)
    time_s        float64    unix seconds of the step (finite, |t| < core.MAX_TIME_S)
    instance      dictionary<string>  the collector process (<= core.MAX_NAME_CHARS)
    dispatch_s_L  fixed_size_binary(L*4)  little-endian float32 [L] seconds; NaN = not measured
    compute_s_L   fixed_size_binary(L*4)  idem, this rank's expert FFNs
    combine_s_L   fixed_size_binary(L*4)  idem, the all-to-all back and the weighted sum
    layer_s_L     fixed_size_binary(L*4)  idem, the whole MoE layer

The float32 arrays are raw bytes (as the step table's counts): a row group reads into one zero-copy
float32 [R, L] view per phase, NaN bit patterns kept exactly; list<float32> and fixed_size_list<float32>
store the same bytes but read about twice as slowly (repetition levels), and pyarrow 15 cannot read a
byte-stream-split binary column. A measured time is finite, >= 0 and below core.MAX_PHASE_S. A row breaking
a bound is a bad record (counted, skipped), as core.decode_timing would refuse it.

Timing lines of a JSON-lines file (a .jsonl trace, an .arrows side file) are indexed and read by
timing_lines.py (TimingLines).
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

from .decode import as_ints, as_texts, fixed_width_view, long_instances, step_rank_errors
from .schema import DICTIONARY_TEXT, META_FORMAT, META_VERSION, ROW_KEY_FIELDS

TIMING_FORMAT = "moe-trace-timings"
TIMING_FORMAT_VERSION = 1
META_LAYERS = b"moe.layers"
META_TIMING_ROWS = b"moe.timing_rows"  # in the .parquet trace's own metadata: rows written to its sidecar
TIMING_ARRAYS = ("dispatch_s_L", "compute_s_L", "combine_s_L", "layer_s_L")  # core.TIMING_PHASES order
TIMING_COLUMNS = ("step", "rank", "world", "time_s", "instance", *TIMING_ARRAYS)
TIMING_DTYPE = np.dtype("<f4")
TIMING_GROUP_ROWS = 2048        # rows per row group of the sidecar (about 2 MB at L = 58)
ZSTD_LEVEL = 3
MAX_GROUP_BYTES = 1 << 30       # a row group a reader takes at once (declared rows x row width)
MAX_READ_BYTES = 4 << 30        # the float32 arrays one read_timings call may return


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
    if rows * num_layers * len(TIMING_ARRAYS) * TIMING_DTYPE.itemsize > MAX_READ_BYTES:
        raise ValueError(f"steps {first_step}..{last_step} hold more than {MAX_READ_BYTES >> 30} GiB of layer "
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
            if info.num_rows * width > MAX_GROUP_BYTES or info.total_byte_size > 2 * MAX_GROUP_BYTES:
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

"""Reading the two columnar containers, memory-mapped: the .arrows recording (Arrow IPC stream, IpcTraceReader)
and the .parquet archive (ParquetTraceReader), each a ColumnarReader over pieces of the step table (record
batches, row groups) that know the step ids they hold and the bytes they decode to, read only when a view
overlaps them. At open, before any body or page is decoded, what the whole file decodes to is counted from its
metadata (an IPC stream's message headers, read with a small FlatBuffers reader; a Parquet file's footer) and
checked against the budget (core/budget.py); then only the small per-row columns (ROW_COLUMNS) are decoded, for
the timeline and the rows-per-step bound. docs/traces.md ("What a file may decode to") says why and how.
"""
from __future__ import annotations

import functools
import io
import os
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_monitor import core
from moe_monitor.core.budget import check_decoded, decoded_budget_bytes

from .jsonl import read_side_jsonl
from .reader import MAX_READ_BYTES, TraceReader, dedupe, out_of_memory
from .schema import STEP_COLUMNS, check_rows_per_step, decode_rows, parse_metadata, text_objects
from .side import (
    META_TIMING_ROWS,
    GpuSamples,
    TimingTable,
    gpu_sidecar,
    read_gpu_parquet,
    side_path,
    timings_sidecar,
)
from .timeline import Timeline, good_rows, timeline_of_rows

# ------------------------------------------------------------------ the reader part both containers share
TIMELINE_COLUMNS = ("step", "rank", "world", "time_s", "phase", "tokens", "balancedness")
ROW_COLUMNS = (*TIMELINE_COLUMNS, "instance")  # read at open: the timeline and the rows-per-step bound
RECORD_OVERHEAD_BYTES = 512  # a decoded record's Python objects beyond its counts and sample
# what reading a sample costs beyond its column's own bytes, per byte its row declares: the decompressed page,
# the dictionary built from it, the record's copy and the check of its ids (measured 4.7-6x in all: docs/traces.md)
SAMPLE_READ_COST = 5


@dataclass
class Piece:
    """A part of the step table: rows, the step ids it holds (first..last), how to load it and the bytes
    loading it decodes to (its columns, and the dictionaries it needs)."""

    rows: int
    first_step: int
    last_step: int
    load: Callable[[], pa.RecordBatch | pa.Table]
    decoded_bytes: int = 0


def _ints(column) -> np.ndarray:
    return pc.fill_null(column, -1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


class ColumnarReader(TraceReader):
    """TraceReader over pieces and the table of ROW_COLUMNS of every row (both set by the container's reader
    at open, the table through _set_rows)."""

    pieces: list[Piece]
    _rows: pa.Table

    def _set_rows(self, table: pa.Table) -> None:
        """Keep the ROW_COLUMNS of every row; ValueError when a step holds more rows than a trace may."""
        check_rows_per_step(table)
        self._rows = table

    def timeline(self) -> Timeline:
        table = self._rows
        step, rank, world = _ints(table["step"]), _ints(table["rank"]), _ints(table["world"])
        time_s = pc.fill_null(table["time_s"], np.nan).to_numpy()
        phase = text_objects(table["phase"])
        tokens = _ints(table["tokens"])
        eta = pc.fill_null(table["balancedness"], np.nan).to_numpy()
        ok = good_rows(step, rank, world, time_s, phase, tokens)
        return timeline_of_rows(step[ok], rank[ok], time_s[ok], phase[ok], tokens[ok], eta[ok], self.layouts)

    def read_steps(self, first_step: int, last_step: int) -> list[core.StepRecord]:
        first_step, last_step = int(first_step), int(last_step)
        wanted = [p for p in self.pieces if p.last_step >= first_step and p.first_step <= last_step]
        if sum(p.decoded_bytes + p.rows * RECORD_OVERHEAD_BYTES for p in wanted) > MAX_READ_BYTES:
            raise ValueError(f"steps {first_step}..{last_step} decode to more than {MAX_READ_BYTES >> 30} GiB: "
                             "read a shorter range")
        try:
            return dedupe(self._decode(wanted, first_step, last_step))
        except MemoryError:
            raise out_of_memory(self.path, first_step, last_step) from None

    def _decode(self, wanted: list[Piece], first_step: int, last_step: int) -> list[core.StepRecord]:
        """The records of steps first_step..last_step in the pieces wanted (bad rows counted)."""
        out: list[core.StepRecord] = []
        for piece in wanted:
            data = piece.load()
            batches = data.to_batches() if isinstance(data, pa.Table) else [data]
            for batch in batches:
                step = _ints(batch.column("step"))
                keep = (step >= first_step) & (step <= last_step)
                if not keep.any():
                    continue
                decoded = decode_rows(batch, self.meta, keep)
                out.extend(decoded.records)
                if decoded.bad_records:
                    self.bad_records += decoded.bad_records
                    self.last_error = decoded.last_error
        return out


def step_range(column) -> tuple[int, int]:
    """(min, max) step id of a step column; (0, -1) when it holds none."""
    if len(column) == 0 or column.null_count == len(column):
        return 0, -1
    low_high = pc.min_max(column)
    return int(low_high["min"].as_py()), int(low_high["max"].as_py())


# ------------------------------------------------------------------ .arrows: FlatBuffers, enough for a message header
# Message.fbs's Message, RecordBatch, DictionaryBatch, BodyCompression, every offset checked against the buffer
# (a bad one is a ValueError, never a read outside). A table starts with an int32 soffset back to its vtable:
# uint16 [vtable bytes, table bytes, field offsets...], 0 for an absent field (its default applies). Offsets to
# sub-tables and vectors are uint32 relative to where they are stored; a vector is a uint32 length, then its
# elements. pyarrow does not expose a header's buffers or compression without decoding the body.
class FlatTable:
    """A FlatBuffers table at byte pos of buf."""

    def __init__(self, buf: bytes, pos: int):
        self.buf = buf
        self.pos = pos
        self.vtable = pos - _unpack(buf, "<i", pos)
        self.vtable_bytes = _unpack(buf, "<H", self.vtable)

    def _offset(self, field: int) -> int:
        slot = 4 + 2 * field
        return 0 if slot + 2 > self.vtable_bytes else _unpack(self.buf, "<H", self.vtable + slot)

    def scalar(self, field: int, fmt: str, default: int) -> int:
        """The scalar field (struct format fmt, e.g. "<q"), default when absent."""
        off = self._offset(field)
        return default if off == 0 else _unpack(self.buf, fmt, self.pos + off)

    def table(self, field: int) -> FlatTable | None:
        """The sub-table field, None when absent."""
        off = self._offset(field)
        if off == 0:
            return None
        where = self.pos + off
        return FlatTable(self.buf, where + _unpack(self.buf, "<I", where))

    def struct_vector(self, field: int, fmt: str) -> list[tuple[int, ...]]:
        """The vector of structs field (each struct one struct format, e.g. "<qq"), [] when absent."""
        off = self._offset(field)
        if off == 0:
            return []
        where = self.pos + off
        start = where + _unpack(self.buf, "<I", where)
        count = _unpack(self.buf, "<I", start)
        size = struct.calcsize(fmt)
        if start + 4 + count * size > len(self.buf):
            raise ValueError(f"a vector of {count} entries runs past its {len(self.buf)}-byte message header")
        return [struct.unpack_from(fmt, self.buf, start + 4 + i * size) for i in range(count)]


def root_table(buf: bytes) -> FlatTable:
    """The root table of a FlatBuffers buffer."""
    return FlatTable(buf, _unpack(buf, "<I", 0))


def _unpack(buf: bytes, fmt: str, pos: int) -> int:
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise ValueError(f"an offset ({pos}) outside its {len(buf)}-byte message header")
    return struct.unpack_from(fmt, buf, pos)[0]


# ------------------------------------------------------------------ .arrows: the index, from message headers only
# Per record batch: its message's place, rows, the bytes it decodes to and the dictionary messages in force
# for it (the latest non-delta one of each id and the deltas after it), so it decodes on its own, later. Bytes
# from the header: with BodyCompression each buffer starts with its int64 uncompressed length (-1: stored as
# is), without it the buffers' own lengths. A message that does not read ends the index (truncated = True).
HEADER_DICTIONARY = 2  # MessageHeader union: Schema 1, DictionaryBatch 2, RecordBatch 3
HEADER_RECORD_BATCH = 3
Span = tuple[int, int]  # (start, end) byte offsets of one message in the file


@dataclass(frozen=True)
class BatchIndex:
    """One record batch: its message's span, rows, decoded_bytes (its own buffers), load_bytes (with the
    dictionaries in force, what decoding it allocates at most) and the spans of those dictionary messages in
    stream order."""

    span: Span
    rows: int
    decoded_bytes: int
    load_bytes: int
    dictionaries: tuple[Span, ...]


@dataclass
class StreamIndex:
    """schema: the stream's schema (with its metadata); header: the span of the schema message; batches in
    stream order; decoded_bytes: what every message of the stream decodes to, together."""

    schema: pa.Schema
    header: Span
    batches: list[BatchIndex] = field(default_factory=list)
    decoded_bytes: int = 0
    truncated: bool = False
    last_error: str = ""


def index_stream(data: pa.Buffer) -> StreamIndex:
    """The index of the IPC stream in data (the memory-mapped file); ValueError when its first message is not
    a schema."""
    source = pa.BufferReader(data)
    messages = pa.ipc.MessageReader.open_stream(source)
    try:
        schema = pa.ipc.read_schema(messages.read_next_message())
    except (StopIteration, OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"not an Arrow IPC stream trace ({str(exc)[:160] or 'no schema message'})") from None
    index = StreamIndex(schema=schema, header=(0, source.tell()))
    in_force: dict[int, list[tuple[Span, int]]] = {}  # dictionary id -> (span, decoded bytes) since its last base
    while True:
        start = source.tell()
        try:
            message = messages.read_next_message()
        except StopIteration:
            break
        except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            return _cut(index, f"the stream ends inside a message (a recording cut short): {str(exc)[:160]}")
        span = (start, source.tell())
        try:
            kind, header = _header(message.metadata.to_pybytes())
            decoded = body_bytes(header if kind == HEADER_RECORD_BATCH else _data_of(header), message.body)
        except ValueError as exc:
            return _cut(index, f"message at byte {start}: {exc}")
        index.decoded_bytes += decoded
        if kind == HEADER_DICTIONARY:
            dictionary_id, delta = header.scalar(0, "<q", 0), header.scalar(2, "<B", 0)
            chain = in_force.setdefault(dictionary_id, [])
            if not delta:
                chain.clear()
            chain.append((span, decoded))
            continue
        held = sorted((item for chain in in_force.values() for item in chain), key=lambda item: item[0])
        index.batches.append(BatchIndex(span=span, rows=header.scalar(0, "<q", 0), decoded_bytes=decoded,
                                        load_bytes=decoded + sum(n for _, n in held),
                                        dictionaries=tuple(s for s, _ in held)))
    return index


def _cut(index: StreamIndex, why: str) -> StreamIndex:
    index.truncated, index.last_error = True, why
    return index


def _header(metadata: bytes) -> tuple[int, FlatTable]:
    """(header type, header table) of a Message flatbuffer; ValueError unless a record or dictionary batch."""
    message = root_table(metadata)
    kind = message.scalar(1, "<B", 0)
    header = message.table(2)
    if kind not in (HEADER_DICTIONARY, HEADER_RECORD_BATCH) or header is None:
        raise ValueError(f"a message of type {kind} where record batches and dictionaries are expected")
    return kind, header


def _data_of(dictionary_batch: FlatTable) -> FlatTable:
    data = dictionary_batch.table(1)
    if data is None:
        raise ValueError("a dictionary batch without its data")
    return data


def body_bytes(record_batch: FlatTable, body: pa.Buffer | None) -> int:
    """Bytes the buffers of a RecordBatch header decode to (compressed or not), read from the header and
    the body's per-buffer length prefixes; ValueError for a buffer outside the body or a bad prefix."""
    rows = record_batch.scalar(0, "<q", 0)
    if rows < 0:
        raise ValueError(f"a record batch of {rows} rows")
    compressed = record_batch.table(3) is not None
    size = 0 if body is None else body.size
    total = 0
    for offset, length in record_batch.struct_vector(2, "<qq"):
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError(f"a buffer ({offset}, {length}) outside the {size}-byte message body")
        if not compressed or length == 0:
            total += length
            continue
        if length < 8:
            raise ValueError(f"a compressed buffer of {length} bytes (no room for its length)")
        assert body is not None
        uncompressed = int(np.frombuffer(body, dtype="<i8", count=1, offset=offset)[0])
        if uncompressed < -1:
            raise ValueError(f"a compressed buffer claiming {uncompressed} bytes")
        total += length - 8 if uncompressed == -1 else uncompressed
    return total


# ------------------------------------------------------------------ .arrows: one record batch at a time, any order
# A pyarrow stream reader reads from a queue handed, per batch, the file's bytes of the dictionary messages in
# force for it and then its own message: zero-copy views of the mapped file. A reader may leave fields out
# (IpcReadOptions.included_fields: their buffers are not decompressed).
class _Queue(io.RawIOBase):
    """A readable stream of the byte ranges pushed so far, in order."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: deque[memoryview] = deque()

    def readable(self) -> bool:
        return True

    def push(self, part: memoryview) -> None:
        self._parts.append(part)

    def read(self, size: int = -1) -> memoryview | bytes:
        """size bytes: a zero-copy view when they lie in one part (pyarrow reads a message's prefix, header
        and body one at a time, each inside the part pushed for it), else a copy."""
        head = self._parts[0] if self._parts else None
        if head is not None and 0 <= size <= len(head):
            if size == len(head):
                self._parts.popleft()
            else:
                self._parts[0] = head[size:]
            return head[:size]
        return super().read(size) or b""

    def readinto(self, out) -> int:
        target = memoryview(out).cast("B")
        filled = 0
        while filled < len(target) and self._parts:
            head = self._parts[0]
            take = min(len(target) - filled, len(head))
            target[filled:filled + take] = head[:take]
            filled += take
            if take == len(head):
                self._parts.popleft()
            else:
                self._parts[0] = head[take:]
        return filled


class BatchFeed:
    """Record batches of the stream in data (the mapped file) decoded on demand; fields: the schema's field
    indices to decode (None: all)."""

    def __init__(self, data: pa.Buffer, index: StreamIndex, fields: Sequence[int] | None = None):
        self._view = memoryview(data).cast("B")
        self._header = index.header
        self._options = pa.ipc.IpcReadOptions(included_fields=list(fields)) if fields is not None else None
        self._queue: _Queue | None = None
        self._reader: pa.ipc.RecordBatchStreamReader | None = None

    def load(self, batch: BatchIndex) -> pa.RecordBatch:
        """The batch, decoded (with its dictionaries); pa.ArrowInvalid / OSError when it does not decode (the
        next load starts a fresh reader)."""
        try:
            queue, reader = self._open()
            for span in (*batch.dictionaries, batch.span):
                queue.push(self._slice(span))
            return reader.read_next_batch()
        except BaseException:
            self._queue = self._reader = None  # whatever the reader had half read is dropped with it
            raise

    def _open(self) -> tuple[_Queue, pa.ipc.RecordBatchStreamReader]:
        if self._queue is None or self._reader is None:
            queue = _Queue()
            queue.push(self._slice(self._header))
            self._reader = pa.ipc.open_stream(pa.PythonFile(queue, mode="r"), options=self._options)
            self._queue = queue
        return self._queue, self._reader

    def _slice(self, span: Span) -> memoryview:
        return self._view[span[0]:span[1]]

    def close(self) -> None:
        self._queue = self._reader = None  # batches already handed out keep the mapped file alive


# ------------------------------------------------------------------ .arrows: the reader
# The side file <path>.side.jsonl adds late layouts, the NVML samples and the timing lines (jsonl.py). A batch
# that does not decode or validate is counted as bad records (its rows) when it is first read.
MAX_BATCH_ROWS = 1 << 22


class IpcTraceReader(ColumnarReader):
    container = "arrows (Arrow IPC stream)"

    def __init__(self, path: str, max_decoded_bytes: int | None = None):
        super().__init__(path)
        try:
            self._map = pa.memory_map(path, "r")
            data = self._map.read_buffer()
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{path}: not an Arrow IPC stream trace ({str(exc)[:160]})") from None
        index = index_stream(data)
        self.meta, layouts, bad = parse_metadata(index.schema)
        self.bad_records += bad
        if index.truncated:
            self.truncated, self.last_error = True, index.last_error
        budget = decoded_budget_bytes() if max_decoded_bytes is None else max_decoded_bytes
        check_decoded(f"{path}: its record batches ({len(index.batches)})", index.decoded_bytes, budget)
        self._schema = index.schema
        self._feed = BatchFeed(data, index)
        row_fields = [index.schema.get_field_index(name) for name in (*ROW_COLUMNS, "sample_n", "sample_k")]
        rows_feed = BatchFeed(data, index, row_fields)
        self._bad_batches: set[int] = set()
        self.pieces, row_batches = [], []
        samples_cost = 0  # what reading the samples costs beyond their buffers (SAMPLE_READ_COST)
        for number, batch in enumerate(index.batches):
            small = self._small_columns(rows_feed, number, batch)
            if small is None:
                continue
            row_batches.append(small)
            first, last = step_range(small.column("step"))
            cost = int(sample_bytes_R(len(self.meta.layer_names), small.column("sample_n"),
                                      small.column("sample_k")).sum()) * SAMPLE_READ_COST
            samples_cost += cost
            self.pieces.append(Piece(batch.rows, first, last, functools.partial(self._load, number, batch),
                                     decoded_bytes=batch.load_bytes + cost))
        rows_feed.close()
        check_decoded(f"{path}: its record batches ({len(index.batches)}) with their samples",
                      index.decoded_bytes + samples_cost, budget)
        read_order = pa.schema([index.schema.field(i) for i in sorted(row_fields)])
        self._set_rows(pa.Table.from_batches(row_batches, schema=read_order).select(list(ROW_COLUMNS)))
        side = read_side_jsonl(side_path(path), self.meta)
        self._side = side
        if side.bad_records:
            self.bad_records += side.bad_records
            self.last_error = side.last_error
        self.layouts = merge_layouts(layouts, side.layouts)

    def _small_columns(self, feed: BatchFeed, number: int, batch: BatchIndex) -> pa.RecordBatch | None:
        """The ROW_COLUMNS of batch number (None, counted as bad, when it is too long or does not decode)."""
        try:
            if batch.rows > MAX_BATCH_ROWS:
                raise ValueError(f"a record batch of {batch.rows} rows")
            small = feed.load(batch)
            small.validate(full=True)
            return small
        except (ValueError, OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            self._count_bad(number, batch, exc)
            return None

    def _load(self, number: int, batch: BatchIndex) -> pa.RecordBatch | pa.Table:
        """The whole batch, decoded now (an empty table, counted once as bad, when it does not decode)."""
        if number not in self._bad_batches:
            try:
                whole = self._feed.load(batch)
                whole.validate(full=True)
                return whole
            except (ValueError, OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                self._count_bad(number, batch, exc)
        return self._schema.empty_table()

    def _count_bad(self, number: int, batch: BatchIndex, exc: BaseException) -> None:
        if number not in self._bad_batches:
            self._bad_batches.add(number)
            self.bad_records += batch.rows or 1
            self.last_error = f"record batch {number}: {str(exc)[:160]}"

    def gpu_samples(self, t0_s: float = -np.inf, t1_s: float = np.inf) -> list[core.GpuSample]:
        return self._side.samples_between(t0_s, t1_s)

    def read_timings(self, first_step: int, last_step: int) -> list[core.TimingRecord]:
        return self._timings_of(self._side.timings.read(int(first_step), int(last_step), self.meta))

    def timing_rows(self) -> int:
        return self._side.timings.rows

    def size_bytes(self) -> int:
        side = side_path(self.path)
        return os.path.getsize(self.path) + (os.path.getsize(side) if os.path.isfile(side) else 0)

    def close(self) -> None:
        self.pieces = []
        self._feed.close()
        self._map.close()


def merge_layouts(*groups: list[core.LayoutRecord]) -> list[core.LayoutRecord]:
    """Layout records of several places in step order, a record present twice (same step, source, map) once."""
    seen, out = set(), []
    for rec in sorted((r for group in groups for r in group), key=lambda r: r.step):
        key = (rec.step, rec.source, rec.gpus, rec.layout_LP.tobytes())
        if key not in seen:
            seen.add(key)
            out.append(rec)
    return out



# ------------------------------------------------------------------ .parquet: what row groups decode to (footer)
# Per column chunk of a row group of R rows: a fixed-width column R x its width (plus validity), whatever its
# encoding; a dictionary column (phase, instance, scope, and sample, read as a dictionary) its int32 indices and
# at most the chunk's declared uncompressed size; the sample column again at the size its rows declare
# (sample_bytes_R). Shape legend: R rows, G row groups.
def group_bytes_G(metadata: pq.FileMetaData, schema: pa.Schema) -> np.ndarray:
    """int64 [G]: bytes the step columns of each row group decode to; ValueError for a row group or column
    chunk declaring negative sizes."""
    out = np.zeros(metadata.num_row_groups, dtype=np.int64)
    wanted = set(STEP_COLUMNS)
    for group in range(metadata.num_row_groups):
        info = metadata.row_group(group)
        rows = info.num_rows
        if rows < 0:
            raise ValueError(f"row group {group} declares {rows} rows")
        total = 0
        for j in range(info.num_columns):
            chunk = info.column(j)
            name = chunk.path_in_schema
            if name not in wanted:
                continue
            kind = schema.field(name).type
            if pa.types.is_dictionary(kind) or not _fixed_width(kind):
                if chunk.total_uncompressed_size < 0:
                    raise ValueError(f"row group {group} column {name} declares {chunk.total_uncompressed_size} bytes")
                total += rows * 4 + chunk.total_uncompressed_size
            else:
                total += rows * kind.byte_width + (rows + 7) // 8
        out[group] = total
    return out


def _fixed_width(kind: pa.DataType) -> bool:
    try:
        return kind.byte_width > 0
    except ValueError:
        return False


def sample_bytes_R(num_layers: int, sample_n: pa.ChunkedArray | pa.Array,
                   sample_k: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """int64 [R]: the sample bytes each row declares, L x sample_n x sample_k x 2 (0 where either is null;
    each clipped to its bound, core/keys.py: a row beyond them is a bad record, its sample never decoded)."""
    n = np.clip(sample_n.fill_null(0).to_numpy().astype(np.int64), 0, core.MAX_CELLS)
    k = np.clip(sample_k.fill_null(0).to_numpy().astype(np.int64), 0, core.MAX_EXPERTS)
    return num_layers * n * k * core.SAMPLE_DTYPE.itemsize


def per_group(values_R: np.ndarray, rows_G: np.ndarray) -> np.ndarray:
    """int64 [G]: values_R summed over the rows of each row group (rows in row-group order)."""
    ends = np.cumsum(rows_G)
    totals = np.concatenate([[0], np.cumsum(values_R, dtype=np.int64)])
    return totals[ends] - totals[ends - rows_G]


# ------------------------------------------------------------------ .parquet: the reader
# Only the step columns are read, the sample column as a dictionary; the NVML samples come from
# <stem>.gpu.parquet, the layer timings from <stem>.timings.parquet (opened at the first read_timings).
MAX_GROUP_BYTES = 1 << 30


class ParquetTraceReader(ColumnarReader):
    container = "parquet (zstd)"

    def __init__(self, path: str, max_decoded_bytes: int | None = None):
        super().__init__(path)
        try:
            with pq.ParquetFile(path, memory_map=True) as plain:
                self.meta, self.layouts, bad = parse_metadata(plain.schema_arrow, plain.metadata.metadata)
            self._file = pq.ParquetFile(path, memory_map=True, read_dictionary=["sample"])  # has one: checked
            schema = self._file.schema_arrow
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{path}: not a Parquet trace ({str(exc)[:160]})") from None
        self.bad_records += bad
        meta = self._file.metadata
        rows_G = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], dtype=np.int64)
        bytes_G = group_bytes_G(meta, schema)
        budget = decoded_budget_bytes() if max_decoded_bytes is None else max_decoded_bytes
        what = f"{path}: its row groups ({meta.num_row_groups}, {int(rows_G.sum())} rows)"
        check_decoded(what, int(bytes_G.sum()), budget)
        for group in np.flatnonzero(bytes_G > MAX_GROUP_BYTES)[:1]:
            raise ValueError(f"{path}: row group {group} declares {rows_G[group]} rows ({bytes_G[group]} bytes "
                             "decoded), more than a reader takes at once")
        rows = self._read_columns([*ROW_COLUMNS, "sample_n", "sample_k"])
        sample_R = sample_bytes_R(len(self.meta.layer_names), rows["sample_n"], rows["sample_k"])
        bytes_G += per_group(sample_R * SAMPLE_READ_COST, rows_G)
        check_decoded(f"{what} with their samples", int(bytes_G.sum()), budget)
        self._set_rows(rows.select(list(ROW_COLUMNS)))
        step_index = schema.get_field_index("step")
        self.pieces = []
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(step_index).statistics
            if stats is not None and stats.has_min_max:
                first, last = int(stats.min), int(stats.max)
            else:
                first, last = step_range(self._file.read_row_group(group, columns=["step"])["step"])
            self.pieces.append(Piece(int(rows_G[group]), first, last, functools.partial(self._read_group, group),
                                     decoded_bytes=int(bytes_G[group])))
        self._gpu: GpuSamples | None = None
        self._timings: TimingTable | None = None
        self._timing_rows_written = _timing_rows_said(self._file.metadata.metadata or {})

    def _read_columns(self, columns: list[str]) -> pa.Table:
        try:
            return self._file.read(columns=columns)
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{self.path}: its step columns do not read ({str(exc)[:160]})") from None

    def _read_group(self, group: int) -> pa.Table:
        try:
            return self._file.read_row_group(group, columns=list(STEP_COLUMNS))
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{self.path}: row group {group} does not read ({str(exc)[:160]})") from None

    def gpu_samples(self, t0_s: float = -np.inf, t1_s: float = np.inf) -> list[core.GpuSample]:
        if self._gpu is None:
            self._gpu = read_gpu_parquet(str(gpu_sidecar(self.path)))
            if self._gpu.bad_records:
                self.bad_records += self._gpu.bad_records
                self.last_error = self._gpu.last_error
        return self._gpu.samples_between(t0_s, t1_s)

    def _timing_table(self) -> TimingTable:
        if self._timings is None:
            self._timings = TimingTable(timings_sidecar(self.path), self.meta, self._timing_rows_written)
            if self._timings.bad_records:
                self.bad_records += self._timings.bad_records
                self.last_error = self._timings.last_error
        return self._timings

    def read_timings(self, first_step: int, last_step: int) -> list[core.TimingRecord]:
        return self._timings_of(self._timing_table().read(int(first_step), int(last_step)))

    def timing_rows(self) -> int:
        return self._timing_table().rows

    def size_bytes(self) -> int:
        sides = [p for p in (gpu_sidecar(self.path), timings_sidecar(self.path)) if p.is_file()]
        return os.path.getsize(self.path) + sum(os.path.getsize(p) for p in sides)

    def close(self) -> None:
        if self._timings is not None:
            self._timings.close()
        self._file.close()


def _timing_rows_said(raw: dict[bytes, bytes]) -> int | None:
    """The timing rows the trace's metadata says were written (None: not said, a trace from before timings
    were kept; an unreadable count is taken as not said)."""
    text = raw.get(META_TIMING_ROWS)
    if text is None or not text.isdigit() or len(text) > 19:
        return None
    return int(text)

"""Reading an .arrows trace (Arrow IPC stream, core/tracefile/ipc.py) memory-mapped: the stream is indexed at
open from its message headers alone (core/tracefile/ipc_index.py: every record batch's place, rows and the
bytes it decodes to, compressed or not), the whole file's decoded bytes are checked against the budget
(core/budget.py) before any body is decoded, and then only the small per-row columns of each batch are
decoded (columnar.ROW_COLUMNS: the timeline, each batch's step range, the rows-per-step bound). A view
decodes the batches it overlaps when it reads them (core/tracefile/ipc_feed.py), none is kept. The side file
<path>.side.jsonl adds late layout records, the NVML samples and the layer timings (its "timing" lines,
indexed by step at open and decoded when read_timings asks for their steps: core/tracefile/timings.py).

A stream cut short (a recorder killed mid-write) reads up to its last whole record batch (truncated = True).
A batch that does not decode or validate is counted as bad records (its rows) when it is first read.
"""
from __future__ import annotations

import functools
import os

import numpy as np
import pyarrow as pa

from moe_monitor import core
from moe_monitor.core.budget import check_decoded, decoded_budget_bytes

from .columnar import ROW_COLUMNS, ColumnarReader, Piece, step_range
from .ipc_feed import BatchFeed
from .ipc_index import BatchIndex, index_stream
from .recorder import side_path
from .schema import parse_metadata
from .side import read_side_jsonl

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
        row_fields = [index.schema.get_field_index(name) for name in ROW_COLUMNS]
        rows_feed = BatchFeed(data, index, row_fields)
        self._bad_batches: set[int] = set()
        self.pieces, row_batches = [], []
        for number, batch in enumerate(index.batches):
            small = self._small_columns(rows_feed, number, batch)
            if small is None:
                continue
            row_batches.append(small)
            first, last = step_range(small.column("step"))
            self.pieces.append(Piece(batch.rows, first, last, functools.partial(self._load, number, batch),
                                     decoded_bytes=batch.load_bytes))
        rows_feed.close()
        read_order = pa.schema([index.schema.field(i) for i in sorted(row_fields)])
        self._set_rows(pa.Table.from_batches(row_batches, schema=read_order).select(list(ROW_COLUMNS)))
        side = read_side_jsonl(side_path(path), self.meta)
        self._side = side
        if side.bad_records:
            self.bad_records += side.bad_records
            self.last_error = side.last_error
        self.layouts = _merge_layouts(layouts, side.layouts)

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


def _merge_layouts(*groups: list[core.LayoutRecord]) -> list[core.LayoutRecord]:
    """Layout records of several places in step order, a record present twice (same step, source, map) once."""
    seen, out = set(), []
    for rec in sorted((r for group in groups for r in group), key=lambda r: r.step):
        key = (rec.step, rec.source, rec.gpus, rec.physical_to_logical_LP.tobytes())
        if key not in seen:
            seen.add(key)
            out.append(rec)
    return out


merge_layouts = _merge_layouts

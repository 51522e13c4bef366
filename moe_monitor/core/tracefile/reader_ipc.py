"""Reading an .arrows trace (Arrow IPC stream, core/tracefile/ipc.py) memory-mapped: the stream's record batches are
indexed once at open (message headers only; their buffers stay in the mapped file until a view reads them),
with their step ranges; the side file <path>.side.jsonl adds late layout records, the NVML samples and the
layer timings (its "timing" lines, indexed by step at open and decoded when read_timings asks for their
steps: core/tracefile/timings.py).

A stream cut short (a recorder killed mid-write) reads up to its last whole record batch (truncated = True).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from moe_monitor import core

from .columnar import TIMELINE_COLUMNS, ColumnarReader, Piece, step_range
from .recorder import side_path
from .schema import parse_metadata
from .side import read_side_jsonl

MAX_BATCH_ROWS = 1 << 22


class IpcTraceReader(ColumnarReader):
    container = "arrows (Arrow IPC stream)"

    def __init__(self, path: str):
        super().__init__(path)
        try:
            self._map = pa.memory_map(path, "r")
            stream = pa.ipc.open_stream(self._map)
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{path}: not an Arrow IPC stream trace ({str(exc)[:160]})") from None
        self.meta, layouts, bad = parse_metadata(stream.schema)
        self.bad_records += bad
        width = stream.schema.field("counts").type.byte_width
        self._batches: list[pa.RecordBatch] = []
        self.pieces = []
        while True:
            try:
                batch = stream.read_next_batch()
            except StopIteration:
                break
            except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                self.truncated = True
                self.last_error = f"the stream ends inside a record batch (a recording cut short): {str(exc)[:160]}"
                break
            try:
                if batch.num_rows > MAX_BATCH_ROWS or batch.column("counts").type.byte_width != width:
                    raise ValueError(f"a record batch of {batch.num_rows} rows")
                batch.validate(full=True)
            except (ValueError, pa.ArrowInvalid) as exc:
                self.bad_records += batch.num_rows or 1
                self.last_error = f"record batch {len(self._batches)}: {str(exc)[:160]}"
                continue
            self._batches.append(batch)
            first, last = step_range(batch.column("step"))
            self.pieces.append(Piece(batch.num_rows, first, last, _const(batch)))
        side = read_side_jsonl(side_path(path), self.meta)
        self._side = side
        if side.bad_records:
            self.bad_records += side.bad_records
            self.last_error = side.last_error
        self.layouts = _merge_layouts(layouts, side.layouts)

    def _timeline_table(self) -> pa.Table:
        if not self._batches:
            return pa.table({name: pa.array([], _TYPES[name]) for name in TIMELINE_COLUMNS})
        return pa.Table.from_batches([b.select(list(TIMELINE_COLUMNS)) for b in self._batches])

    def gpu_samples(self, t0_s: float = -np.inf, t1_s: float = np.inf) -> list[core.GpuSample]:
        return self._side.samples_between(t0_s, t1_s)

    def read_timings(self, first_step: int, last_step: int) -> list[core.TimingRecord]:
        return self._timings_of(self._side.timings.read(int(first_step), int(last_step), self.meta))

    def timing_rows(self) -> int:
        return self._side.timings.rows

    def size_bytes(self) -> int:
        import os
        side = side_path(self.path)
        return os.path.getsize(self.path) + (os.path.getsize(side) if os.path.isfile(side) else 0)

    def close(self) -> None:
        self._batches, self.pieces = [], []
        self._map.close()


def _const(batch: pa.RecordBatch) -> Callable[[], pa.RecordBatch]:
    return lambda: batch


_TYPES = {"step": pa.int64(), "rank": pa.int32(), "world": pa.int32(), "time_s": pa.float64(),
          "phase": pa.string(), "tokens": pa.int64(), "balancedness": pa.float64()}


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

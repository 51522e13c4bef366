"""Reading a .parquet trace (core/tracefile/writers.py): memory-mapped; the timeline reads only its small columns,
read_steps only the row groups whose step statistics overlap the view. The NVML samples come from the
sidecar <stem>.gpu.parquet when it exists, the layer timings from the sidecar <stem>.timings.parquet
(core/tracefile/timings.py; opened at the first read_timings / timing_rows, its row groups read as the steps' are).
A trace whose metadata lacks moe.timing_rows (written before timings were kept) reads the sidecar when there
is one; a trace that says it wrote N rows and has no such sidecar, or one that does not read, is one bad
record with one message, and its steps read as before.

A hostile file cannot make a read allocate more than MAX_GROUP_BYTES per row group: its declared rows x the
counts width (and its uncompressed size) are checked before a row group is read.
"""
from __future__ import annotations

import functools
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moe_monitor import core

from .columnar import TIMELINE_COLUMNS, ColumnarReader, Piece, step_range
from .schema import parse_metadata
from .side import SideRecords, read_gpu_parquet
from .timings import META_TIMING_ROWS, TimingTable, timings_sidecar
from .writers import gpu_sidecar

MAX_GROUP_BYTES = 1 << 30


class ParquetTraceReader(ColumnarReader):
    container = "parquet (zstd)"

    def __init__(self, path: str):
        super().__init__(path)
        try:
            self._file = pq.ParquetFile(path, memory_map=True)
            schema = self._file.schema_arrow
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{path}: not a Parquet trace ({str(exc)[:160]})") from None
        self.meta, self.layouts, bad = parse_metadata(schema, self._file.metadata.metadata)
        self.bad_records += bad
        width = schema.field("counts").type.byte_width
        step_index = schema.get_field_index("step")
        self.pieces = []
        meta = self._file.metadata
        for group in range(meta.num_row_groups):
            info = meta.row_group(group)
            if info.num_rows * (width + 64) > MAX_GROUP_BYTES or info.total_byte_size > 2 * MAX_GROUP_BYTES:
                raise ValueError(f"{path}: row group {group} declares {info.num_rows} rows "
                                 f"({info.total_byte_size} bytes), more than a reader takes at once")
            stats = info.column(step_index).statistics
            if stats is not None and stats.has_min_max:
                first, last = int(stats.min), int(stats.max)
            else:
                first, last = step_range(self._file.read_row_group(group, columns=["step"])["step"])
            self.pieces.append(Piece(info.num_rows, first, last, functools.partial(self._read_group, group)))
        self._gpu: SideRecords | None = None
        self._timings: TimingTable | None = None
        self._timing_rows_written = _count(self._file.metadata.metadata or {})

    def _read_group(self, group: int) -> pa.Table:
        try:
            return self._file.read_row_group(group)
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{self.path}: row group {group} does not read ({str(exc)[:160]})") from None

    def _timeline_table(self) -> pa.Table:
        try:
            return self._file.read(columns=list(TIMELINE_COLUMNS))
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{self.path}: its step columns do not read ({str(exc)[:160]})") from None

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


def _count(raw: dict[bytes, bytes]) -> int | None:
    """The timing rows the trace's metadata says were written (None: not said, a trace from before timings
    were kept; an unreadable count is taken as not said)."""
    text = raw.get(META_TIMING_ROWS)
    if text is None or not text.isdigit() or len(text) > 19:
        return None
    return int(text)

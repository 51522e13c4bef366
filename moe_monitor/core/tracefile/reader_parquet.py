"""Reading a .parquet trace (core/tracefile/writers.py): memory-mapped; the timeline reads only its small columns,
read_steps only the row groups whose step statistics overlap the view. The NVML samples come from the
sidecar <stem>.gpu.parquet when it exists, the layer timings from the sidecar <stem>.timings.parquet
(core/tracefile/timings.py; opened at the first read_timings / timing_rows, its row groups read as the steps' are).
A trace whose metadata lacks moe.timing_rows (written before timings were kept) reads the sidecar when there
is one; a trace that says it wrote N rows and has no such sidecar, or one that does not read, is one bad
record with one message, and its steps read as before.

What the file decodes to is counted from its metadata at open, before any page is read
(core/tracefile/parquet_budget.py: every row group's step columns, the sample column at the size its rows
declare), and checked against the budget (core/budget.py), as is each row group against MAX_GROUP_BYTES.
Only the step columns are read (a column the schema does not name is never decoded), the sample column as a
dictionary (a value repeated on many rows decoded once), and the small per-row columns (columnar.ROW_COLUMNS,
with sample_n / sample_k) once at open.
"""
from __future__ import annotations

import functools
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moe_monitor import core
from moe_monitor.core.budget import check_decoded, decoded_budget_bytes

from .columnar import ROW_COLUMNS, ColumnarReader, Piece, step_range
from .parquet_budget import group_bytes_G, per_group, sample_bytes_R
from .schema import STEP_COLUMNS, parse_metadata
from .side import SideRecords, read_gpu_parquet
from .timings import META_TIMING_ROWS, TimingTable, timings_sidecar
from .writers import gpu_sidecar

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
        bytes_G += per_group(sample_bytes_R(len(self.meta.layer_names), rows["sample_n"], rows["sample_k"]), rows_G)
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
        self._gpu: SideRecords | None = None
        self._timings: TimingTable | None = None
        self._timing_rows_written = _count(self._file.metadata.metadata or {})

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


def _count(raw: dict[bytes, bytes]) -> int | None:
    """The timing rows the trace's metadata says were written (None: not said, a trace from before timings
    were kept; an unreadable count is taken as not said)."""
    text = raw.get(META_TIMING_ROWS)
    if text is None or not text.isdigit() or len(text) > 19:
        return None
    return int(text)

"""The reader part shared by both columnar containers: pieces of the step table (record batches of an IPC
stream, row groups of a Parquet file), each with the range of step ids it holds and the bytes it decodes to
(from the file's metadata), read only when a view overlaps it. The small per-row columns (ROW_COLUMNS) are
read once at open, for the timeline and the rows-per-step bound (core/tracefile/rows.py); a read_steps range
is refused before anything is decoded when its pieces decode to more than MAX_READ_BYTES with their records.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moe_monitor import core

from .base import MAX_READ_BYTES, TraceReader, dedupe
from .decode import decode_rows, text_objects
from .rows import check_rows_per_step
from .timeline import Timeline, good_rows, timeline_of_rows

TIMELINE_COLUMNS = ("step", "rank", "world", "time_s", "phase", "tokens", "balancedness")
ROW_COLUMNS = (*TIMELINE_COLUMNS, "instance")  # read at open: the timeline and the rows-per-step bound
RECORD_OVERHEAD_BYTES = 512  # a decoded record's Python objects beyond its counts and sample


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
        return dedupe(out)


def step_range(column) -> tuple[int, int]:
    """(min, max) step id of a step column; (0, -1) when it holds none."""
    if len(column) == 0 or column.null_count == len(column):
        return 0, -1
    low_high = pc.min_max(column)
    return int(low_high["min"].as_py()), int(low_high["max"].as_py())

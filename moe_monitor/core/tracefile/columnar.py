"""The reader part shared by both columnar containers: pieces of the step table (record batches of an IPC
stream, row groups of a Parquet file), each with the range of step ids it holds, read only when a view
overlaps it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moe_monitor import core

from .base import MAX_READ_BYTES, TraceReader, dedupe
from .decode import decode_rows
from .timeline import Timeline, good_rows, timeline_of_rows

TIMELINE_COLUMNS = ("step", "rank", "world", "time_s", "phase", "tokens", "balancedness")


@dataclass
class Piece:
    """A part of the step table: rows, the step ids it holds (first..last) and how to load it."""

    rows: int
    first_step: int
    last_step: int
    load: Callable[[], pa.RecordBatch | pa.Table]


def _ints(column) -> np.ndarray:
    return pc.fill_null(column, -1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


class ColumnarReader(TraceReader):
    """TraceReader over pieces (set by the container's reader) and a table of the timeline columns."""

    pieces: list[Piece]

    def _timeline_table(self) -> pa.Table:
        raise NotImplementedError

    def timeline(self) -> Timeline:
        table = self._timeline_table()
        step, rank, world = _ints(table["step"]), _ints(table["rank"]), _ints(table["world"])
        time_s = pc.fill_null(table["time_s"], np.nan).to_numpy()
        phase = pc.cast(table["phase"], pa.string()).to_numpy(zero_copy_only=False)
        tokens = _ints(table["tokens"])
        eta = pc.fill_null(table["balancedness"], np.nan).to_numpy()
        ok = good_rows(step, rank, world, time_s, phase, tokens)
        return timeline_of_rows(step[ok], rank[ok], time_s[ok], phase[ok], tokens[ok], eta[ok], self.layouts)

    def read_steps(self, first_step: int, last_step: int) -> list[core.StepRecord]:
        first_step, last_step = int(first_step), int(last_step)
        wanted = [p for p in self.pieces if p.last_step >= first_step and p.first_step <= last_step]
        width = len(self.meta.layer_names) * self.meta.num_experts * 4
        if sum(p.rows for p in wanted) * width > MAX_READ_BYTES:
            raise ValueError(f"steps {first_step}..{last_step} hold more than {MAX_READ_BYTES >> 30} GiB of counts: "
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

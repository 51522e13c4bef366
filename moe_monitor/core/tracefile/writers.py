"""Writing a whole trace at once (convert, record): open_writer(path, meta) by extension.

.parquet: one Parquet file, zstd, row groups of ROW_GROUP_ROWS rows in step order (the step column's
statistics let a reader skip the row groups outside its view); the layout records go into the file's
key-value metadata at close (so records that arrive while recording are kept), the NVML samples into the
sidecar <stem>.gpu.parquet (core/tracefile/gpu.py; written only when there are samples), the layer timings into the
sidecar <stem>.timings.parquet (core/tracefile/timings.py; only when there are timings), and the number of timing
rows into the key-value metadata (moe.timing_rows). Each is written to a hidden temporary name and renamed
at close, the trace itself last: a file that exists is whole.
.arrows: the recording container (core/tracefile/ipc.py): header with every layout known at open, chunks, the end
marker; later layouts, the NVML samples and the layer timings in <path>.side.jsonl (core/tracefile/recorder.py).

Records must come in step order, every rank of a step in the same write (so each step's balancedness is
known; core/tracefile/encode.py).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from moe_monitor import core

from .balance import LayoutSchedule
from .encode import step_batch
from .gpu import gpu_table
from .recorder import ArrowRecorder
from .schema import META_LAYOUTS, schema_metadata, step_schema
from .timings import META_TIMING_ROWS, TimingTableWriter, timings_sidecar

ROW_GROUP_ROWS = 256
ZSTD_LEVEL = 3
SUFFIXES = (".parquet", ".arrows")


def gpu_sidecar(path: str | os.PathLike[str]) -> Path:
    """<stem>.gpu.parquet beside a .parquet trace."""
    p = Path(path)
    return p.with_name(p.name[:-len(".parquet")] + ".gpu.parquet" if p.name.endswith(".parquet") else p.name + ".gpu.parquet")


class ParquetTraceWriter:
    def __init__(self, path: str | os.PathLike[str], meta: core.RunMeta, layouts: Sequence[core.LayoutRecord] = ()):
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.part")
        self._layouts = list(layouts)
        self._schedule = LayoutSchedule(meta, self._layouts)
        self._schema = step_schema(len(meta.layer_names), meta.num_experts, schema_metadata(meta, self._layouts))
        self._writer = pq.ParquetWriter(self._tmp, self._schema, compression="zstd", compression_level=ZSTD_LEVEL,
                                        write_statistics=["step"], use_dictionary=["phase", "instance", "scope"])
        self._samples: list[core.GpuSample] = []
        self._timings = TimingTableWriter(timings_sidecar(self.path), len(meta.layer_names))
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0

    def add_layouts(self, layouts: Sequence[core.LayoutRecord]) -> None:
        for rec in layouts:
            self._layouts.append(rec)
            self._schedule.add(rec)

    def write(self, records: Sequence[core.StepRecord], samples: Sequence[core.GpuSample] = (),
              timings: Sequence[core.TimingRecord] = ()) -> None:
        """Append step records (step order, every rank of a step in one write), NVML samples and layer timings
        (float32 [L] per phase, L the run's layers; any order). ValueError for a record that does not fit."""
        self._samples.extend(samples)
        self._timings.write(timings)
        if records:
            self._pending.append(step_batch(records, self._schema, self._schedule))
            self._pending_rows += len(records)
            if self._pending_rows >= ROW_GROUP_ROWS:
                self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._writer.write_table(pa.Table.from_batches(self._pending, self._schema), row_group_size=ROW_GROUP_ROWS)
            self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        self._flush()
        lines = "\n".join(core.trace_line("layout", core.encode_layout_record(rec))
                          for rec in sorted(self._layouts, key=lambda r: r.step))
        timing_rows = self._timings.close()
        self._writer.add_key_value_metadata({META_LAYOUTS: lines.encode(), META_TIMING_ROWS: str(timing_rows).encode()})
        self._writer.close()
        side = gpu_sidecar(self.path)
        if self._samples:
            tmp = side.with_name(f".{side.name}.part")
            pq.write_table(gpu_table(self._samples), tmp, compression="zstd")
            os.replace(tmp, side)
        else:
            with contextlib.suppress(FileNotFoundError):
                side.unlink()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        self._timings.abort()
        self._tmp.unlink(missing_ok=True)


class ArrowsTraceWriter:
    def __init__(self, path: str | os.PathLike[str], meta: core.RunMeta, layouts: Sequence[core.LayoutRecord] = ()):
        self.path = Path(path)
        self._recorder = ArrowRecorder(path, meta, None, list(layouts))

    def add_layouts(self, layouts: Sequence[core.LayoutRecord]) -> None:
        self._recorder.write([], [], layouts)

    def write(self, records: Sequence[core.StepRecord], samples: Sequence[core.GpuSample] = (),
              timings: Sequence[core.TimingRecord] = ()) -> None:
        self._recorder.write(records, samples, (), timings)

    def close(self) -> None:
        self._recorder.close()

    def abort(self) -> None:
        self._recorder.close()


TraceWriter = ParquetTraceWriter | ArrowsTraceWriter


def open_writer(path: str | os.PathLike[str], meta: core.RunMeta,
                layouts: Sequence[core.LayoutRecord] = ()) -> TraceWriter:
    """A writer for path by its extension (.parquet or .arrows); ValueError for another."""
    name = os.fspath(path).lower()
    if name.endswith(".parquet"):
        return ParquetTraceWriter(path, meta, layouts)
    if name.endswith(".arrows"):
        return ArrowsTraceWriter(path, meta, layouts)
    raise ValueError(f"{os.fspath(path)}: a trace is written as .parquet (archive) or .arrows (recording)")

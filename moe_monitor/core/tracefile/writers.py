"""Writing traces: open_writer(path, meta) writes a whole trace (convert, record) by its extension; ArrowRecorder
appends a recording (.arrows), for collectors.sinks.TraceFileSink.

.parquet: one file, zstd, row groups of ROW_GROUP_ROWS rows in step order; the layouts and moe.timing_rows go
into its key-value metadata at close, the NVML samples and layer timings into sidecars (side.py); each file is
written under a hidden name and renamed, the trace last: a file that exists is whole. .arrows: an Arrow IPC
stream, a header (the schema, with the run metadata and the layouts known) then one self-contained chunk per
write (StreamEncoder); later layouts, NVML samples and timings go to <path>.side.jsonl. Records come in step
order, every rank of a step in the same write (so each step's balancedness is known: schema.step_batch).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from moe_monitor import core

from .schema import META_LAYOUTS, LayoutSchedule, schema_metadata, step_batch, step_schema
from .side import META_TIMING_ROWS, TimingTableWriter, gpu_sidecar, gpu_table, side_path, timings_sidecar

# ------------------------------------------------------------------ .arrows: the IPC stream's bytes
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the IPC stream's end marker (written at close)


class StreamEncoder:
    """header() and chunk(records) of one .arrows file of a run. Each chunk (that write's dictionary batches,
    then its record batch) is encoded by a fresh in-memory stream writer, so it never depends on dictionaries
    of an earlier chunk that a failed write may have lost: a chunk's dictionaries replace the previous ones
    (the IPC stream format's dictionary replacement), and the file is valid after any whole number of chunks."""

    def __init__(self, meta: core.RunMeta, layouts: Sequence[core.LayoutRecord] = ()):
        self.meta = meta
        self.schedule = LayoutSchedule(meta, list(layouts))
        self.schema = step_schema(len(meta.layer_names), meta.num_experts, schema_metadata(meta, list(layouts)))
        self._header = self._stream_bytes(None)

    def add_layout(self, rec: core.LayoutRecord) -> None:
        """A layout record that arrived after the header: used for the balancedness of later chunks."""
        self.schedule.add(rec)

    def header(self) -> bytes:
        return self._header

    def chunk(self, records: Sequence[core.StepRecord]) -> bytes:
        """The IPC messages of one record batch of records (with its dictionaries); b"" for no records."""
        if not records:
            return b""
        whole = self._stream_bytes(step_batch(records, self.schema, self.schedule))
        return whole[len(self._header):]

    def _stream_bytes(self, batch: pa.RecordBatch | None) -> bytes:
        sink = pa.BufferOutputStream()
        writer = pa.ipc.new_stream(sink, self.schema)
        if batch is not None:
            writer.write_batch(batch)
        writer.close()
        data = sink.getvalue().to_pybytes()
        assert data.endswith(END_OF_STREAM)
        return data[:-len(END_OF_STREAM)]


# ------------------------------------------------------------------ .arrows: the recorder
class ArrowRecorder:
    """Appends a run's steps to an Arrow IPC stream file <path>, one chunk per write, flushed after each; the
    layouts and NVML samples that arrive after the header, and the layer timings ("timing" lines), go to the
    side file <path>.side.jsonl (opened only when there is one).

    Same semantics as the JSON-lines sink: max_bytes caps <path> (None: no cap): before a chunk would take it
    past the cap, <path> becomes <path>.1 (its side file <path>.1.side.jsonl), replacing older ones, and a new
    <path> starts with a header holding the metadata and the layout in force, so each file replays on its own.
    A write that raises (a full disk) closes the files; the next write truncates <path> back to its last whole
    chunk (what the failure let through is dropped, so the size stays honest) and goes on. A batch offered
    again after a failure may repeat NVML/layout lines in the side file; readers skip repeated steps."""

    def __init__(self, path: str | os.PathLike[str], meta: core.RunMeta, max_bytes: int | None = None,
                 layouts: Sequence[core.LayoutRecord] = ()):
        self._path = os.fspath(path)
        self._meta = meta
        self._max_bytes = max_bytes
        self._initial = list(layouts)  # known before the first header (a conversion): all in it
        self._latest_layout: core.LayoutRecord | None = self._initial[-1] if self._initial else None
        self._side: BinaryIO | None = None
        self._file: BinaryIO | None = None
        self._open_new()

    def _open_new(self) -> None:
        known = self._initial or ([self._latest_layout] if self._latest_layout else [])
        self._initial = []
        self._encoder = StreamEncoder(self._meta, known)
        header = self._encoder.header()
        self._file = open(self._path, "wb")  # noqa: SIM115 (open for the run's lifetime)
        self._file.write(header)
        self._file.flush()
        self._good = self._header_bytes = len(header)
        with contextlib.suppress(FileNotFoundError):
            os.remove(side_path(self._path))  # a side file left from an earlier recording is not this one's

    def _reopen(self) -> None:
        """After a failed write: the file as it is on disk, cut back to its last whole chunk (a new one if gone)."""
        if not os.path.exists(self._path) or os.path.getsize(self._path) == 0:
            self._open_new()
            return
        self._file = open(self._path, "r+b")  # noqa: SIM115
        size = os.fstat(self._file.fileno()).st_size
        if size > self._good:
            self._file.truncate(self._good)
        self._file.seek(0, os.SEEK_END)
        self._good = self._file.tell()

    def _rotate(self) -> None:
        self._close_files()
        os.replace(self._path, self._path + ".1")
        if os.path.exists(side_path(self._path)):
            os.replace(side_path(self._path), side_path(self._path + ".1"))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(side_path(self._path + ".1"))
        self._open_new()

    def write(self, records: Sequence[core.StepRecord], samples: Sequence[core.GpuSample],
              layouts: Sequence[core.LayoutRecord] = (), timings: Sequence[core.TimingRecord] = ()) -> None:
        """Append one batch: the steps as one chunk of <path>; layouts, NVML samples and layer timings (wire
        "timing" lines, kept as they are) as lines of the side file."""
        side_lines = [core.trace_line("layout", core.encode_layout_record(rec)) for rec in layouts]
        side_lines += [core.trace_line("gpu", core.encode_gpu_sample(s)) for s in samples]
        side_lines += [core.trace_line("timing", core.encode_timing(t)) for t in timings]
        for rec in layouts:
            self._encoder.add_layout(rec)
        try:
            if self._file is None or self._file.closed:
                self._reopen()
            chunk = self._encoder.chunk(records)
            cap = self._max_bytes
            if chunk and cap is not None and self._good + len(chunk) > cap and self._good > self._header_bytes:
                self._rotate()
                chunk = self._encoder.chunk(records)  # the new file's dictionaries start afresh too
            if side_lines:
                self._write_side(side_lines)
            if chunk:
                assert self._file is not None
                self._file.write(chunk)
                self._file.flush()
                self._good += len(chunk)
            if layouts:
                self._latest_layout = layouts[-1]
        except Exception:
            self._close_files()
            raise

    def _write_side(self, lines: list[str]) -> None:
        if self._side is None or self._side.closed:
            self._side = open(side_path(self._path), "ab")  # noqa: SIM115
        self._side.write(("\n".join(lines) + "\n").encode())
        self._side.flush()

    def _close_files(self) -> None:
        for handle in (self._file, self._side):
            if handle is not None:
                with contextlib.suppress(OSError, ValueError):
                    handle.close()

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            with contextlib.suppress(OSError, ValueError):
                self._file.write(END_OF_STREAM)
        self._close_files()


# ------------------------------------------------------------------ whole traces
ROW_GROUP_ROWS = 256
ZSTD_LEVEL = 3
SUFFIXES = (".parquet", ".arrows")


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

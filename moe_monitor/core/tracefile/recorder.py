"""ArrowRecorder: what collectors.sinks.TraceFileSink does for a path ending in ".arrows" (Arrow IPC stream).

Files of one recording:
    <path>              Arrow IPC stream of the step table (core/tracefile/schema.py): a header, then one chunk (record
                        batch) per write, flushed after each; the schema metadata holds the run metadata and
                        the layout in force when the file was started
    <path>.side.jsonl   JSON lines (core.trace_line) of the layout records and NVML samples that arrived after
                        the header was written, and of the layer timings (core.TimingRecord, "timing" lines:
                        read back by core/tracefile/timings.py); opened only when there is one

Same semantics as the JSON-lines sink: max_bytes caps <path> (None: no cap): before a chunk would take it
past the cap, <path> becomes <path>.1 (its side file <path>.1.side.jsonl), replacing older ones, and a new
<path> starts with a header holding the metadata and the layout in force, so each file replays on its own. A
write that raises (a full disk) closes the files; the next write truncates <path> back to its last whole
chunk (what the failure let through is dropped, so the size stays honest) and goes on. A batch offered again
after a failure may repeat NVML/layout lines in the side file; readers skip repeated steps.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import BinaryIO

from moe_monitor import core

from .ipc import END_OF_STREAM, StreamEncoder

SIDE_SUFFIX = ".side.jsonl"


def side_path(path: str) -> str:
    """The side file of the .arrows file at path."""
    return path + SIDE_SUFFIX


class ArrowRecorder:
    """Appends a run's steps to an Arrow IPC stream file (layouts and NVML samples to its side file)."""

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

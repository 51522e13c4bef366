"""Replay source: a recorded trace file read in chunks as if it were live, and seekable (timeline(),
seek(first, last)). Three containers, told apart by their first bytes (tracefile.container_of): .parquet and
.arrows go through tracefile.open_trace; JSON lines (core.trace_line) are read incrementally by this module, and
indexed by tracefile.open_trace for timeline() and seek(). Layer timings come from every container.

Bounded and distrustful: at most max_entries step lines and TICK_BYTES_BUDGET bytes a poll, lines over
MAX_LINE_BYTES skipped as bad records, only regular files inside `root` opened, a truncated last line waited for
then reported. Formats: docs/traces.md; reading rules: docs/dashboard.md, "How the sources read".
"""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from moe_monitor import core
from moe_monitor.core import tracefile
from moe_monitor.core.tracefile.jsonl import check_line_cost
from moe_monitor.dashboard.sources.base import Batch, Health
from moe_monitor.traces.cursor import Cursor

STALL_POLLS = 2
MAX_LINE_BYTES = core.MAX_TRACE_LINE_BYTES
CHUNK_BYTES = 1 << 20
TICK_BYTES_BUDGET = 24 << 20
OUTSIDE_ROOT = ("only trace files inside the trace folder can be replayed (MOE_TRACE_DIR, else ./recordings): "
                "give the name of a file there")


def trace_file_in(root: str | os.PathLike[str], name: str) -> Path:
    """The file `name` inside the folder root: a relative name is taken inside root, an absolute path must lie
    inside it, and once '..' and symlinks are resolved the file must still be inside root (and not be root).
    ValueError(OUTSIDE_ROOT) otherwise: one message, whether the path exists or not."""
    base = Path(root).resolve()
    text = str(name).strip()
    if not text or "\0" in text:
        raise ValueError(OUTSIDE_ROOT)
    candidate = Path(text) if os.path.isabs(text) else base / text
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a name the OS refuses
        raise ValueError(OUTSIDE_ROOT) from None
    if base not in resolved.parents:
        raise ValueError(OUTSIDE_ROOT)
    return resolved


def _one_line(exc: BaseException, what: str) -> str:
    """A reader's refusal as one line: its ValueError's text; for a MemoryError (a read past what this process
    may take, e.g. under an address-space limit) "<what> needs more memory than this process may take"."""
    if isinstance(exc, MemoryError):
        return f"{what} needs more memory than this process may take ({type(exc).__name__})"
    return str(exc)


class _NotRegular(OSError):
    pass


def _open_regular(path: str | os.PathLike[str], nofollow: bool):
    """path opened for binary reading when it is a regular file; never blocks (O_NONBLOCK: a FIFO opens at
    once and is refused). _NotRegular for anything else, OSError when it cannot be opened."""
    if not stat.S_ISREG(os.stat(path, follow_symlinks=not nofollow).st_mode):
        raise _NotRegular(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | (getattr(os, "O_NOFOLLOW", 0) if nofollow else 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
            raise _NotRegular(path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class TraceSource:
    """Source over a trace file (formats: docs/traces.md). stall_s: seconds without growth
    after which a last line lacking its newline is taken as truncated. recorded: every rank of a step is in
    the file, so a poll that leaves nothing waiting has every step's ranks (the reader assembles them at once)."""

    recorded = True

    def __init__(self, path: str, stall_s: float = 10.0, root: str | os.PathLike[str] | None = None):
        self.path = str(path)
        self.root = root
        self.stall_s = float(stall_s)
        self._offset = 0
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES (already counted), up to its newline
        self._meta: core.RunMeta | None = None
        self._last_time_s: float | None = None
        self._error = ""
        self._finished = False
        self._not_text = ""
        self._size, self._still_polls, self._grew_at = -1, 0, time.monotonic()
        self._container = ""  # "jsonl", "parquet" or "arrows" once the file was first read
        self._cursor: Cursor | None = None  # the forward replay of a columnar file
        self._reader: tracefile.TraceReader | None = None  # what timeline() and seek() read
        self._reader_stamp: tuple[int, int] | None = None  # (size, mtime_ns) of the file _reader opened
        self._bad_reported = 0  # the columnar reader's bad records already counted in a batch
        self._truncation_told = False

    @property
    def finished(self) -> bool:
        """True once the whole file has been replayed."""
        return self._finished

    def poll(self, max_entries: int) -> Batch:
        batch = Batch()
        if self._not_text:
            return batch
        try:
            path = self.path if self.root is None else trace_file_in(self.root, self.path)
        except ValueError as exc:
            self._error = str(exc)
            return batch
        try:
            handle = _open_regular(path, nofollow=self.root is not None)
        except _NotRegular:
            self._error = "not a regular file: a trace is a JSON-lines file (a device, FIFO or folder is not read)"
            return batch
        except OSError as exc:
            self._error = f"cannot read trace file: {exc.strerror or type(exc).__name__}"
            return batch
        try:
            with handle:
                if not self._container:
                    self._container = self._sniff(handle)
                if self._container != "jsonl":
                    self._poll_columnar(str(path), os.fstat(handle.fileno()), max_entries, batch)
                    return batch
                self._read(handle, max_entries, batch)
        except OSError as exc:
            self._error = f"cannot read trace file: {exc.strerror or type(exc).__name__}"
            return batch
        self._error = ""
        return batch

    @staticmethod
    def _sniff(handle) -> str:
        head = handle.read(4)
        handle.seek(0)
        if head == b"PAR1":
            return "parquet"
        return "arrows" if head == b"\xff\xff\xff\xff" else "jsonl"

    def _open_reader(self, path: str, info: os.stat_result) -> tracefile.TraceReader:
        """tracefile.open_trace(path), kept while the file's size and mtime stay the same."""
        stamp = (info.st_size, info.st_mtime_ns)
        if self._reader is None or self._reader_stamp != stamp:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            self._reader = tracefile.open_trace(path)
            self._reader_stamp = stamp
        return self._reader

    def _poll_columnar(self, path: str, info: os.stat_result, max_entries: int, batch: Batch) -> None:
        """The next whole steps of a .parquet / .arrows trace (a grown .arrows file is reopened and continued)."""
        try:
            before = self._reader
            reader = self._open_reader(path, info)
            if self._cursor is None:
                self._cursor = Cursor(reader)
            elif reader is not before:
                self._cursor.refresh(reader)
            self._meta = reader.meta
            chunk = self._cursor.next_chunk(max_entries)
        except (ValueError, MemoryError) as exc:
            self._error = _one_line(exc, f"{path}: reading it")
            self._finished = True
            return
        batch.steps, batch.layouts, batch.gpu_samples, batch.more = chunk.steps, chunk.layouts, chunk.gpu_samples, chunk.more
        batch.timings = chunk.timings
        if reader is not before:
            self._bad_reported = 0  # a reopened file: what it finds is reported afresh
        batch.bad_records = max(0, reader.bad_records - self._bad_reported)  # each bad row or line once
        self._bad_reported = reader.bad_records
        if batch.bad_records:
            batch.last_error = reader.last_error
        elif reader.truncated and self._cursor.done and not self._truncation_told:
            batch.last_error, self._truncation_told = reader.last_error, True
        if chunk.steps:
            self._last_time_s = chunk.steps[-1].time_s
        self._offset += len(chunk.steps)  # steps handed out (the health line's position)
        self._finished = self._cursor.done

    def _seekable_reader(self) -> tracefile.TraceReader:
        """The file opened through tracefile.open_trace (root rules and regular-file checks as for poll);
        ValueError with the reason when it cannot be."""
        path = self.path if self.root is None else trace_file_in(self.root, self.path)
        try:
            handle = _open_regular(path, nofollow=self.root is not None)
        except _NotRegular:
            raise ValueError("not a regular file: a trace is a file (a device, FIFO or folder is not read)") from None
        except OSError as exc:
            raise ValueError(f"cannot read trace file: {exc.strerror or type(exc).__name__}") from None
        with handle:
            return self._open_reader(str(path), os.fstat(handle.fileno()))

    def timeline(self) -> tracefile.Timeline:
        """The trace's steps (tracefile.Timeline: step ids, times, phases, tokens, balancedness per step, the steps
        layout records take force from); ValueError when the file cannot be read as a trace."""
        reader = self._seekable_reader()
        if self._meta is None:
            self._meta = reader.meta
        try:
            return reader.timeline()
        except MemoryError as exc:
            raise ValueError(_one_line(exc, f"{self.path}: its timeline")) from None

    def seek(self, first_step: int, last_step: int) -> Batch:
        """Every record of steps first_step..last_step (inclusive; every rank), their layer timings (every rank,
        (step, rank) order; none when the trace has none), the layout records in force over them (the one in
        force at first_step, then those taking force up to last_step) and the NVML samples of their time span.
        The forward replay (poll) is not moved. Problems are reported in the batch (bad_records, last_error),
        never raised."""
        batch = Batch()
        try:
            reader = self._seekable_reader()
            bad_before = reader.bad_records
            batch.steps = reader.read_steps(first_step, last_step)
            batch.timings = reader.read_timings(first_step, last_step)
            batch.layouts = reader.layouts_in_force(first_step, last_step)
            if batch.steps:
                batch.gpu_samples = reader.gpu_samples(batch.steps[0].time_s, batch.steps[-1].time_s)
            batch.bad_records = reader.bad_records - bad_before
            if batch.bad_records:
                batch.last_error = reader.last_error
            if self._meta is None:
                self._meta = reader.meta
        except (ValueError, MemoryError) as exc:
            batch.bad_records += 1
            batch.last_error = _one_line(exc, f"{self.path}: steps {first_step}..{last_step}")
        return batch

    def _read(self, handle, max_entries: int, batch: Batch) -> None:
        size = os.fstat(handle.fileno()).st_size
        self._note_growth(size)
        handle.seek(self._offset)
        began = self._offset
        while len(batch.steps) < max_entries:
            if self._offset - began >= TICK_BYTES_BUDGET:
                batch.more = True
                break
            if self._skipping:
                if not self._skip(handle, TICK_BYTES_BUDGET - (self._offset - began)):
                    batch.more = self._offset - began >= TICK_BYTES_BUDGET
                    break
                continue
            raw = self._read_line(handle, batch)
            if raw is None:
                continue  # longer than MAX_LINE_BYTES: counted, skipped
            if not raw:
                break
            if not raw.endswith(b"\n") and handle.tell() >= size:
                if self._stalled():
                    self._offset = handle.tell()
                    self._take_last(raw, batch)
                break  # else a line still being written: read it next time
            self._offset = handle.tell()
            if not self._take_raw(raw, batch):
                return
        else:
            batch.more = True
        self._finished = not batch.more and self._offset >= size

    def _read_line(self, handle, batch: Batch) -> bytes | None:
        """The next line from self._offset (with its newline, or a last line without one; b"" at the end).
        None for a line longer than MAX_LINE_BYTES: counted as a bad record and skipped, in chunks that are
        not kept, up to its newline (self._skipping while that is not in the file yet)."""
        start, limit = self._offset, min(CHUNK_BYTES, MAX_LINE_BYTES + 1)
        raw = handle.readline(limit)
        if len(raw) <= MAX_LINE_BYTES and (raw.endswith(b"\n") or len(raw) < limit):
            return raw
        length = len(raw)
        del raw
        while length <= MAX_LINE_BYTES:  # find where the line ends without keeping it
            chunk = handle.read(CHUNK_BYTES)
            newline = chunk.find(b"\n")
            if not chunk or newline >= 0 and length + newline + 1 <= MAX_LINE_BYTES:
                end = length + (newline + 1 if chunk else 0)
                handle.seek(start)
                return handle.read(end)  # a line within the cap (or a last line still being written)
            if newline >= 0:  # ends just past the cap
                length += newline + 1
                handle.seek(start + length)
                self._offset = start + length
                self._bad_line(batch, start)
                return None
            length += len(chunk)
        self._offset = handle.tell()
        self._bad_line(batch, start)
        if length and not self._ends_at(handle, start, length):
            self._skipping = True
        return None

    def _ends_at(self, handle, start: int, length: int) -> bool:
        """True when the `length` bytes read from `start` end with the line's newline."""
        handle.seek(start + length - 1)
        ended = handle.read(1) == b"\n"
        handle.seek(start + length)
        return ended

    def _bad_line(self, batch: Batch, start: int) -> None:
        batch.bad_records += 1
        batch.last_error = f"trace line at byte {start}: longer than {MAX_LINE_BYTES} bytes, skipped"

    def _skip(self, handle, budget: int) -> bool:
        """Read on to the end of the line being skipped, at most budget bytes; True once past its newline."""
        while budget > 0:
            chunk = handle.read(min(CHUNK_BYTES, budget))
            if not chunk:
                return False
            newline = chunk.find(b"\n")
            if newline >= 0:
                self._offset += newline + 1
                handle.seek(self._offset)
                self._skipping = False
                return True
            self._offset += len(chunk)
            budget -= len(chunk)
        return False

    def _note_growth(self, size: int) -> None:
        if size != self._size:
            self._size, self._still_polls, self._grew_at = size, 0, time.monotonic()
        else:
            self._still_polls += 1

    def _stalled(self) -> bool:
        return self._still_polls >= STALL_POLLS and time.monotonic() - self._grew_at >= self.stall_s

    def _take_raw(self, raw: bytes, batch: Batch) -> bool:
        """Decode and take one line (one that would build more than a trace line does is a bad record:
        tracefile.jsonl.check_line_cost); False (and the source stops) when the file is not text."""
        try:
            check_line_cost(raw)
        except ValueError as exc:
            batch.bad_records += 1
            batch.last_error = f"trace line at byte {self._offset - len(raw)}: {exc}"
            return True
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._not_text = (f"{self.path} is not a text trace (binary data at byte {self._offset - len(raw)}; "
                              "a trace is JSON lines, e.g. from collectors.record_trace or trace_path=)")
            batch.bad_records += 1
            batch.last_error = self._not_text
            self._finished = True
            return False
        if line.strip():
            self._take(line, batch, self._offset - len(raw))
        return True

    def _take_last(self, raw: bytes, batch: Batch) -> None:
        """The last line of a file that stopped growing without a final newline."""
        bad_before = batch.bad_records
        if self._take_raw(raw, batch) and batch.bad_records > bad_before:
            batch.last_error = f"trace line at byte {self._offset - len(raw)}: last line incomplete (truncated trace)"
        self._finished = True

    def _take(self, line: str, batch: Batch, at: int) -> None:
        """Decode one line that starts at byte `at` of the file into the batch (a bad line: one bad record)."""
        try:
            _, item = core.decode_trace_line(line)
        except (ValueError, MemoryError) as exc:
            batch.bad_records += 1
            batch.last_error = f"trace line at byte {at}: {_one_line(exc, 'decoding it')}"
            return
        if isinstance(item, core.RunMeta):
            self._meta = item
        elif isinstance(item, core.StepRecord):
            batch.steps.append(item)
            self._last_time_s = item.time_s
        elif isinstance(item, core.LayoutRecord):
            batch.layouts.append(item)
        elif isinstance(item, core.GpuSample):
            batch.gpu_samples.append(item)
        elif isinstance(item, core.TimingRecord):
            batch.timings.append(item)

    def meta(self) -> core.RunMeta | None:
        return self._meta

    def health(self) -> Health:
        if self._not_text:
            return Health(reachable=False, where=self.path, error=self._not_text, note="replay finished")
        where = "step record" if self._container not in ("", "jsonl") else "byte"
        return Health(reachable=not self._error, where=self.path, error=self._error,
                      last_seen_s=self._last_time_s,
                      note="replay finished" if self._finished else f"replaying ({where} {self._offset})")


"""Replay source: a recorded trace file (JSON lines, the format of wire.trace_line), read in chunks as if
it were live.

Format (wire/trace.py owns it; one JSON object per line, UTF-8, blank lines ignored):

    {"kind": "meta", "meta": <RunMeta JSON: a string as wire.encode_meta writes it, or the object>}
    {"kind": "step", ...}   the fields of wire.encode_step(rec); bytes fields base64 in "<name>_b64"
                            ("counts_b64": little-endian int32 [L, E]; "sample_b64": int16 [L, N, K])
    {"kind": "gpu", ...}    the fields of wire.encode_gpu_sample(sample)

The collectors write it (collectors.sinks.TraceFileSink while collecting, collectors.record_trace() from a
run in Redis). Lines are replayed in file order. A line that is not JSON, has an unknown kind or does not decode is skipped and
counted as a bad record, as a malformed Redis entry is. The file is read incrementally (as bytes, each line
decoded on its own): each poll reads at most max_entries step lines further, so a long trace never loads at
once. A last line without its newline is left for the next poll (a recorder may be writing it); once the
file has stopped growing (no growth across STALL_POLLS polls and stall_s seconds) it is parsed as it is,
and reported as "last line incomplete (truncated trace)" when it does not decode. A file that is not UTF-8
text (a .pt or .gz picked by mistake) is reported once as "not a text trace" and not read further.
"""
from __future__ import annotations

import os
import time

import wire
from dashboard.sources.base import Batch, Health

STALL_POLLS = 2


class TraceSource:
    """Source over a JSON-lines trace file (format in the module docstring). stall_s: seconds without growth
    after which a last line lacking its newline is taken as truncated."""

    def __init__(self, path: str, stall_s: float = 10.0):
        self.path = str(path)
        self.stall_s = float(stall_s)
        self._offset = 0
        self._meta: wire.RunMeta | None = None
        self._last_time_s: float | None = None
        self._error = ""
        self._finished = False
        self._not_text = ""
        self._size, self._still_polls, self._grew_at = -1, 0, time.monotonic()

    @property
    def finished(self) -> bool:
        """True once the whole file has been replayed."""
        return self._finished

    def poll(self, max_entries: int) -> Batch:
        batch = Batch()
        if self._not_text:
            return batch
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                self._note_growth(size)
                handle.seek(self._offset)
                while len(batch.steps) < max_entries:
                    raw = handle.readline()
                    if not raw:
                        break
                    if not raw.endswith(b"\n") and handle.tell() >= size:
                        if self._stalled():
                            self._offset = handle.tell()
                            self._take_last(raw, batch)
                        break  # else a line still being written: read it next time
                    self._offset = handle.tell()
                    if not self._take_raw(raw, batch):
                        return batch
                else:
                    batch.more = True
                self._finished = not batch.more and self._offset >= size
        except OSError as exc:
            self._error = f"cannot read trace file: {exc}"
            return batch
        self._error = ""
        return batch

    def _note_growth(self, size: int) -> None:
        if size != self._size:
            self._size, self._still_polls, self._grew_at = size, 0, time.monotonic()
        else:
            self._still_polls += 1

    def _stalled(self) -> bool:
        return self._still_polls >= STALL_POLLS and time.monotonic() - self._grew_at >= self.stall_s

    def _take_raw(self, raw: bytes, batch: Batch) -> bool:
        """Decode and take one line; False (and the source stops) when the file is not text."""
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
            self._take(line, batch)
        return True

    def _take_last(self, raw: bytes, batch: Batch) -> None:
        """The last line of a file that stopped growing without a final newline."""
        bad_before = batch.bad_records
        if self._take_raw(raw, batch) and batch.bad_records > bad_before:
            batch.last_error = f"trace line at byte {self._offset - len(raw)}: last line incomplete (truncated trace)"
        self._finished = True

    def _take(self, line: str, batch: Batch) -> None:
        try:
            _, item = wire.decode_trace_line(line)
        except ValueError as exc:
            batch.bad_records += 1
            batch.last_error = f"trace line at byte {self._offset}: {exc}"
            return
        if isinstance(item, wire.RunMeta):
            self._meta = item
        elif isinstance(item, wire.StepRecord):
            batch.steps.append(item)
            self._last_time_s = item.time_s
        else:
            batch.gpu_samples.append(item)

    def meta(self) -> wire.RunMeta | None:
        return self._meta

    def health(self) -> Health:
        if self._not_text:
            return Health(reachable=False, where=self.path, error=self._not_text, note="replay finished")
        return Health(reachable=not self._error, where=self.path, error=self._error,
                      last_seen_s=self._last_time_s,
                      note="replay finished" if self._finished else f"replaying (byte {self._offset})")


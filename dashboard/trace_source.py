"""Replay source: a recorded trace file (JSON lines, the format of wire.trace_line), read in chunks as if
it were live.

Format (wire.py owns it; one JSON object per line, UTF-8, blank lines ignored):

    {"kind": "meta", "meta": <RunMeta JSON: a string as wire.encode_meta writes it, or the object>}
    {"kind": "step", ...}   the fields of wire.encode_step(rec); bytes fields base64 in "<name>_b64"
                            ("counts_b64": little-endian int32 [L, E]; "sample_b64": int16 [L, N, K])
    {"kind": "gpu", ...}    the fields of wire.encode_gpu_sample(sample)

collectors/trace.py writes it (TraceFileSink while collecting, record_trace() from a run in Redis). Lines
are replayed in file order. A line that is not JSON, has an unknown kind or does not decode is skipped and
counted as a bad record, as a malformed Redis entry is. The file is read incrementally: each poll reads at
most max_entries step lines further, so a long trace never loads at once; a last line without its newline
is left for the next poll (a recorder may be writing it).
"""
from __future__ import annotations

import json
import os

import wire
from dashboard.source import Batch, Health


def decode_trace_line(line: str) -> tuple[str, object]:
    """One trace line -> ("meta", RunMeta) | ("step", StepRecord) | ("gpu", GpuSample). ValueError otherwise."""
    kind, fields = wire.parse_trace_line(line)
    if kind == "meta":
        meta = fields.get("meta")
        if isinstance(meta, dict):
            meta = json.dumps(meta)
        if not isinstance(meta, (str, bytes)):
            raise ValueError("a meta line needs a 'meta' field holding the run metadata")
        return "meta", wire.decode_meta(meta)
    if kind == "step":
        return "step", wire.decode_step(fields)
    if isinstance(fields.get("gpus"), list):
        fields["gpus"] = json.dumps(fields["gpus"])
    return "gpu", wire.decode_gpu_sample(fields)


class TraceSource:
    """Source over a JSON-lines trace file (format in the module docstring)."""

    def __init__(self, path: str):
        self.path = str(path)
        self._offset = 0
        self._meta: wire.RunMeta | None = None
        self._last_time_s: float | None = None
        self._error = ""
        self._finished = False

    @property
    def finished(self) -> bool:
        """True once the whole file has been replayed."""
        return self._finished

    def poll(self, max_entries: int) -> Batch:
        batch = Batch()
        try:
            with open(self.path, "r", encoding="utf-8") as handle:
                handle.seek(self._offset)
                while len(batch.steps) < max_entries:
                    line = handle.readline()
                    if not line:
                        break
                    if not line.endswith("\n") and os.fstat(handle.fileno()).st_size == handle.tell():
                        break  # a line still being written: read it next time
                    self._offset = handle.tell()
                    if line.strip():
                        self._take(line, batch)
                else:
                    batch.more = True
                self._finished = not batch.more and self._offset >= os.fstat(handle.fileno()).st_size
        except OSError as exc:
            self._error = f"cannot read trace file: {exc}"
            return batch
        self._error = ""
        return batch

    def _take(self, line: str, batch: Batch) -> None:
        try:
            kind, item = decode_trace_line(line)
        except ValueError as exc:
            batch.bad_records += 1
            batch.last_error = f"trace line at byte {self._offset}: {exc}"
            return
        if kind == "meta":
            self._meta = item
        elif kind == "step":
            batch.steps.append(item)
            self._last_time_s = item.time_s
        else:
            batch.gpu_samples.append(item)

    def meta(self) -> wire.RunMeta | None:
        return self._meta

    def health(self) -> Health:
        return Health(reachable=not self._error, where=self.path, error=self._error,
                      last_seen_s=self._last_time_s,
                      note="replay finished" if self._finished else f"replaying (byte {self._offset})")


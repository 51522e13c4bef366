"""Replay source: a recorded trace file (JSON lines), read in chunks as if it were live.

Format (one JSON object per line, UTF-8; blank lines ignored):

    {"kind": "meta", ...}   the fields of wire.encode_meta's JSON (run, model_name, layer_names,
                            num_experts, top_k, ..., layout: {gpus, nodes, physical_to_logical_map})
    {"kind": "step", ...}   the fields of wire.encode_step(rec): v, run, rank, world, step, t, phase,
                            tokens, L, E, dropped, and optional sample_n, sample_k; the binary fields
                            "counts" (little-endian int32 [L, E]) and "sample" (little-endian int16
                            [L, N, K]) base64-encoded (standard alphabet, with padding)
    {"kind": "gpu", ...}    the fields of wire.encode_gpu_sample(sample); "gpus" may be the JSON string
                            wire writes or the list itself

Lines are replayed in file order. A line that is not JSON, has an unknown kind or does not decode is
skipped and counted as a bad record, as a malformed Redis entry is. The file is read incrementally: each
poll reads at most max_entries step lines further, so a long trace never loads at once.
"""
from __future__ import annotations

import base64
import binascii
import json
import os

import wire
from dashboard.source import Batch, Health


def decode_trace_line(line: str) -> tuple[str, object]:
    """One trace line -> ("meta", RunMeta) | ("step", StepRecord) | ("gpu", GpuSample). ValueError otherwise."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("a trace line must be a JSON object")
    kind = obj.pop("kind", None)
    if kind == "meta":
        return "meta", wire.decode_meta(json.dumps(obj))
    if kind == "step":
        for name in ("counts", "sample"):
            if name in obj:
                try:
                    obj[name] = base64.b64decode(obj[name], validate=True)
                except (binascii.Error, TypeError, ValueError) as exc:
                    raise ValueError(f"field {name!r} is not base64: {exc}") from None
        return "step", wire.decode_step(obj)
    if kind == "gpu":
        if isinstance(obj.get("gpus"), list):
            obj["gpus"] = json.dumps(obj["gpus"])
        return "gpu", wire.decode_gpu_sample(obj)
    raise ValueError(f"unknown kind {kind!r} (expected 'meta', 'step' or 'gpu')")


def encode_trace_step(rec: wire.StepRecord) -> str:
    """The trace line for one step record (the format this reader reads; used by tests and tools)."""
    fields = wire.encode_step(rec)
    obj = {"kind": "step"}
    for name, value in fields.items():
        obj[name] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
    return json.dumps(obj, separators=(",", ":"))


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
                      last_seen_s=self._last_time_s)


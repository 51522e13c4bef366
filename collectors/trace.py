"""Trace recording: every published step and NVML sample appended to a JSON-lines file (wire.trace_line).

Written on the publisher thread, never on the model's, and flushed after every batch (a live replay sees it,
a killed process loses at most one batch). `record_trace(redis_url, run, path)` dumps what a
run's streams hold now, for a run collected elsewhere.
"""
from __future__ import annotations

import wire


class TraceFileSink:
    """Appends the run's metadata once, then one line per step record."""

    def __init__(self, path: str, meta: wire.RunMeta):
        self.path = path
        self._file = open(path, "w", encoding="utf-8")
        self._file.write(wire.trace_line("meta", {"meta": wire.encode_meta(meta)}) + "\n")

    def write_step(self, record: wire.StepRecord) -> None:
        self._file.write(wire.trace_line("step", wire.encode_step(record)) + "\n")

    def write_gpu(self, sample: wire.GpuSample) -> None:
        self._file.write(wire.trace_line("gpu", wire.encode_gpu_sample(sample)) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def record_trace(redis_url: str, run: str, path: str, batch: int = 500) -> int:
    """Copy run's metadata, step stream and GPU stream from Redis into a trace file. Returns steps written."""
    client = wire.connect(redis_url, timeout_s=5.0)
    meta_json = client.get(wire.meta_key(run))
    if meta_json is None:
        raise ValueError(f"run {run!r} has no metadata in Redis")
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write(wire.trace_line("meta", {"meta": meta_json.decode()}) + "\n")
        for key, kind in ((wire.steps_key(run), "step"), (wire.gpu_key(run), "gpu")):
            last = "-"
            while True:
                entries = client.xrange(key, min=last, max="+", count=batch)
                if not entries:
                    break
                for entry_id, fields in entries:
                    clean = {k.decode(): (v if k in (b"counts", b"sample") else v.decode())
                             for k, v in fields.items()}
                    out.write(wire.trace_line(kind, clean) + "\n")
                    written += kind == "step"
                last = "(" + entries[-1][0].decode()  # exclusive: after the last entry written
    return written

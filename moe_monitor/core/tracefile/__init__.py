"""The trace containers, read and written: the .arrows recording (Arrow IPC stream), the .parquet archive (zstd)
and JSON-lines traces (docs/traces.md). open_trace tells them apart by their first bytes (a rotated
<name>.arrows.1 opens too). Collectors write them; the planner, the dashboard and moe_monitor.traces read them.

    reader = open_trace("run.parquet")   # or .arrows / .jsonl
    reader.timeline()                    # Timeline: step_T, time_s_T, phase_T, tokens_T, balancedness_T
    reader.read_steps(100, 699)          # list[core.StepRecord], every rank of those steps
    reader.read_timings(100, 699)        # list[core.TimingRecord], every rank's layer timings of those steps

Modules: schema (the step table), side (the tables beside it), timeline, reader, columnar, jsonl, writers, sandbox.
"""
from __future__ import annotations

import os
import stat

from .reader import TraceInfo, TraceReader
from .schema import FORMAT_VERSION
from .timeline import Timeline
from .writers import open_writer

PARQUET_MAGIC = b"PAR1"
IPC_MAGIC = b"\xff\xff\xff\xff"  # an IPC stream's first continuation marker

__all__ = ["FORMAT_VERSION", "IPC_MAGIC", "PARQUET_MAGIC", "Timeline", "TraceInfo", "TraceReader", "container_of",
           "open_trace", "open_writer"]


def container_of(path: str | os.PathLike[str]) -> str:
    """'parquet', 'arrows' or 'jsonl' for the file at path, by its first bytes; ValueError when it is not a
    regular file or is empty."""
    p = os.fspath(path)
    try:
        info = os.stat(p)
    except OSError as exc:
        raise ValueError(f"{p}: {exc.strerror or 'cannot be read'}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{p}: not a regular file")
    if info.st_size == 0:
        raise ValueError(f"{p}: empty file")
    with open(p, "rb") as handle:
        head = handle.read(4)
    if head == PARQUET_MAGIC:
        return "parquet"
    if head == IPC_MAGIC:
        return "arrows"
    return "jsonl"


def open_trace(path: str | os.PathLike[str], max_decoded_bytes: int | None = None) -> TraceReader:
    """The trace at path opened for reading; ValueError (one line naming the file) when it is not one, or
    decodes to more than max_decoded_bytes (None: the budget of core/budget.py: max_decoded_bytes, else
    $MOE_TRACE_MAX_DECODED_MIB, else 1 GiB). Rows or lines that do not decode are counted in
    reader.bad_records instead. A columnar file is refused before anything of it is decoded when its metadata
    says it decodes to more; a JSON-lines trace decodes to less than its size (no compression)."""
    p = os.fspath(path)
    kind = container_of(p)
    try:
        if kind == "parquet":
            from .columnar import ParquetTraceReader
            return ParquetTraceReader(p, max_decoded_bytes)
        if kind == "arrows":
            from .columnar import IpcTraceReader
            return IpcTraceReader(p, max_decoded_bytes)
        from .jsonl import JsonlTraceReader
        return JsonlTraceReader(p)
    except ValueError as exc:
        text = str(exc)
        raise ValueError(text if text.startswith(p) else f"{p}: {text}") from None
    except (OSError, MemoryError, RecursionError) as exc:
        raise ValueError(f"{p}: cannot be read as a trace ({type(exc).__name__}: {str(exc)[:160]})") from None

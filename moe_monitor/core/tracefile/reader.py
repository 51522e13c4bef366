"""open_trace(path): a TraceReader for any of the three trace containers, told apart by their first bytes
(not their names, so a rotated <name>.arrows.1 opens too):

    Parquet       "PAR1"                      core/tracefile/reader_parquet.py
    Arrow IPC     0xFFFFFFFF (a continuation)  core/tracefile/reader_ipc.py (the .arrows recording)
    JSON lines    anything else that is text  core/tracefile/reader_jsonl.py (indexed once, bounded)

Every problem with the file is one ValueError naming it; rows or lines that do not decode are counted in
reader.bad_records instead. A columnar file is refused before anything of it is decoded when its metadata
says it decodes to more than the decoded-bytes budget (core/budget.py: max_decoded_bytes, else
$MOE_TRACE_MAX_DECODED_MIB, else 1 GiB). A JSON-lines trace decodes to less than its size (no compression);
its index holds a few numbers per line.
"""
from __future__ import annotations

import os
import stat

from .base import TraceReader

PARQUET_MAGIC = b"PAR1"
IPC_MAGIC = b"\xff\xff\xff\xff"


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
    decodes to more than max_decoded_bytes (None: the budget of core/budget.py)."""
    p = os.fspath(path)
    kind = container_of(p)
    try:
        if kind == "parquet":
            from .reader_parquet import ParquetTraceReader
            return ParquetTraceReader(p, max_decoded_bytes)
        if kind == "arrows":
            from .reader_ipc import IpcTraceReader
            return IpcTraceReader(p, max_decoded_bytes)
        from .reader_jsonl import JsonlTraceReader
        return JsonlTraceReader(p)
    except ValueError as exc:
        text = str(exc)
        raise ValueError(text if text.startswith(p) else f"{p}: {text}") from None
    except (OSError, MemoryError, RecursionError) as exc:
        raise ValueError(f"{p}: cannot be read as a trace ({type(exc).__name__}: {str(exc)[:160]})") from None

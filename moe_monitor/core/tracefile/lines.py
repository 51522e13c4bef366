"""Bounded reading of JSON-lines files (a trace, an .arrows side file): lines of at most
core.MAX_TRACE_LINE_BYTES, a longer one skipped (read on in chunks that are not kept) and reported as bad."""
from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from moe_monitor import core

CHUNK_BYTES = 1 << 20


def iter_lines(handle: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(byte offset, line without its newline) for each non-blank line; (offset, None) for a line over the cap."""
    cap = core.MAX_TRACE_LINE_BYTES
    offset = handle.tell()
    while True:
        raw = handle.readline(cap + 1)
        if not raw:
            return
        if len(raw) > cap and not raw.endswith(b"\n"):
            length = len(raw)
            del raw
            while True:
                chunk = handle.readline(CHUNK_BYTES)
                length += len(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield offset, None
            offset += length
            continue
        if raw.strip():
            yield offset, raw.rstrip(b"\r\n")
        offset += len(raw)


def decode_line(raw: bytes):
    """core.decode_trace_line of a raw line; ValueError for anything malformed (not UTF-8 included)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    return core.decode_trace_line(text)

"""Decoding the record batches of an indexed Arrow IPC stream (core/tracefile/ipc_index.py) one at a time, in
any order, never all at open: a pyarrow stream reader reads from a queue that is handed, per batch, the
file's bytes of the dictionary messages in force for it and then its own message (zero-copy views of the
memory-mapped file: a decoded uncompressed buffer is the file's own bytes, as when the file is read
directly). The schema message is read once per reader; a reader may leave fields out
(IpcReadOptions.included_fields: their buffers are not decompressed).
"""
from __future__ import annotations

import io
from collections import deque
from collections.abc import Sequence

import pyarrow as pa

from .ipc_index import BatchIndex, Span, StreamIndex


class _Queue(io.RawIOBase):
    """A readable stream of the byte ranges pushed so far, in order."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: deque[memoryview] = deque()

    def readable(self) -> bool:
        return True

    def push(self, part: memoryview) -> None:
        self._parts.append(part)

    def read(self, size: int = -1) -> memoryview | bytes:
        """size bytes: a zero-copy view when they lie in one part (pyarrow reads a message's prefix, header
        and body one at a time, each inside the part pushed for it), else a copy."""
        head = self._parts[0] if self._parts else None
        if head is not None and 0 <= size <= len(head):
            if size == len(head):
                self._parts.popleft()
            else:
                self._parts[0] = head[size:]
            return head[:size]
        return super().read(size) or b""

    def readinto(self, out) -> int:
        target = memoryview(out).cast("B")
        filled = 0
        while filled < len(target) and self._parts:
            head = self._parts[0]
            take = min(len(target) - filled, len(head))
            target[filled:filled + take] = head[:take]
            filled += take
            if take == len(head):
                self._parts.popleft()
            else:
                self._parts[0] = head[take:]
        return filled


class BatchFeed:
    """Record batches of the stream in data (the mapped file) decoded on demand; fields: the schema's field
    indices to decode (None: all)."""

    def __init__(self, data: pa.Buffer, index: StreamIndex, fields: Sequence[int] | None = None):
        self._view = memoryview(data).cast("B")
        self._header = index.header
        self._options = pa.ipc.IpcReadOptions(included_fields=list(fields)) if fields is not None else None
        self._queue: _Queue | None = None
        self._reader: pa.ipc.RecordBatchStreamReader | None = None

    def load(self, batch: BatchIndex) -> pa.RecordBatch:
        """The batch, decoded (with its dictionaries); pa.ArrowInvalid / OSError when it does not decode (the
        next load starts a fresh reader)."""
        try:
            queue, reader = self._open()
            for span in (*batch.dictionaries, batch.span):
                queue.push(self._slice(span))
            return reader.read_next_batch()
        except BaseException:
            self._queue = self._reader = None  # whatever the reader had half read is dropped with it
            raise

    def _open(self) -> tuple[_Queue, pa.ipc.RecordBatchStreamReader]:
        if self._queue is None or self._reader is None:
            queue = _Queue()
            queue.push(self._slice(self._header))
            self._reader = pa.ipc.open_stream(pa.PythonFile(queue, mode="r"), options=self._options)
            self._queue = queue
        return self._queue, self._reader

    def _slice(self, span: Span) -> memoryview:
        return self._view[span[0]:span[1]]

    def close(self) -> None:
        self._queue = self._reader = None  # batches already handed out keep the mapped file alive

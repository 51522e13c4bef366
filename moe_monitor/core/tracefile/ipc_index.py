"""The index of an Arrow IPC stream (an .arrows recording), read from its message headers only: no body is
decompressed or decoded here. Per record batch: where its message lies in the file, its rows, the bytes it
decodes to and the dictionary messages in force for it (the latest non-delta one of each dictionary id and the
deltas after it), so that a batch can be decoded on its own, later (core/tracefile/ipc_feed.py).

Bytes a message decodes to, from its header (Message.fbs) and the first 8 bytes of each body buffer: with
BodyCompression every buffer starts with its int64 uncompressed length (-1: stored as is), without it the
buffers' own lengths. Every message counts once, record batches and dictionaries alike, whatever reads it.

A message that does not read (the stream cut short, a header that does not parse) ends the index there:
truncated = True, with last_error; what came before it reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .flatbuf import FlatTable, root_table

HEADER_DICTIONARY = 2  # MessageHeader union: Schema 1, DictionaryBatch 2, RecordBatch 3
HEADER_RECORD_BATCH = 3
Span = tuple[int, int]  # (start, end) byte offsets of one message in the file


@dataclass(frozen=True)
class BatchIndex:
    """One record batch: its message's span, rows, decoded_bytes (its own buffers), load_bytes (with the
    dictionaries in force, what decoding it allocates at most) and the spans of those dictionary messages in
    stream order."""

    span: Span
    rows: int
    decoded_bytes: int
    load_bytes: int
    dictionaries: tuple[Span, ...]


@dataclass
class StreamIndex:
    """schema: the stream's schema (with its metadata); header: the span of the schema message; batches in
    stream order; decoded_bytes: what every message of the stream decodes to, together."""

    schema: pa.Schema
    header: Span
    batches: list[BatchIndex] = field(default_factory=list)
    decoded_bytes: int = 0
    truncated: bool = False
    last_error: str = ""


def index_stream(data: pa.Buffer) -> StreamIndex:
    """The index of the IPC stream in data (the memory-mapped file); ValueError when its first message is not
    a schema."""
    source = pa.BufferReader(data)
    messages = pa.ipc.MessageReader.open_stream(source)
    try:
        schema = pa.ipc.read_schema(messages.read_next_message())
    except (StopIteration, OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"not an Arrow IPC stream trace ({str(exc)[:160] or 'no schema message'})") from None
    index = StreamIndex(schema=schema, header=(0, source.tell()))
    in_force: dict[int, list[tuple[Span, int]]] = {}  # dictionary id -> (span, decoded bytes) since its last base
    while True:
        start = source.tell()
        try:
            message = messages.read_next_message()
        except StopIteration:
            break
        except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            return _cut(index, f"the stream ends inside a message (a recording cut short): {str(exc)[:160]}")
        span = (start, source.tell())
        try:
            kind, header = _header(message.metadata.to_pybytes())
            decoded = body_bytes(header if kind == HEADER_RECORD_BATCH else _data_of(header), message.body)
        except ValueError as exc:
            return _cut(index, f"message at byte {start}: {exc}")
        index.decoded_bytes += decoded
        if kind == HEADER_DICTIONARY:
            dictionary_id, delta = header.scalar(0, "<q", 0), header.scalar(2, "<B", 0)
            chain = in_force.setdefault(dictionary_id, [])
            if not delta:
                chain.clear()
            chain.append((span, decoded))
            continue
        held = sorted((item for chain in in_force.values() for item in chain), key=lambda item: item[0])
        index.batches.append(BatchIndex(span=span, rows=header.scalar(0, "<q", 0), decoded_bytes=decoded,
                                        load_bytes=decoded + sum(n for _, n in held),
                                        dictionaries=tuple(s for s, _ in held)))
    return index


def _cut(index: StreamIndex, why: str) -> StreamIndex:
    index.truncated, index.last_error = True, why
    return index


def _header(metadata: bytes) -> tuple[int, FlatTable]:
    """(header type, header table) of a Message flatbuffer; ValueError unless a record or dictionary batch."""
    message = root_table(metadata)
    kind = message.scalar(1, "<B", 0)
    header = message.table(2)
    if kind not in (HEADER_DICTIONARY, HEADER_RECORD_BATCH) or header is None:
        raise ValueError(f"a message of type {kind} where record batches and dictionaries are expected")
    return kind, header


def _data_of(dictionary_batch: FlatTable) -> FlatTable:
    data = dictionary_batch.table(1)
    if data is None:
        raise ValueError("a dictionary batch without its data")
    return data


def body_bytes(record_batch: FlatTable, body: pa.Buffer | None) -> int:
    """Bytes the buffers of a RecordBatch header decode to (compressed or not), read from the header and
    the body's per-buffer length prefixes; ValueError for a buffer outside the body or a bad prefix."""
    rows = record_batch.scalar(0, "<q", 0)
    if rows < 0:
        raise ValueError(f"a record batch of {rows} rows")
    compressed = record_batch.table(3) is not None
    size = 0 if body is None else body.size
    total = 0
    for offset, length in record_batch.struct_vector(2, "<qq"):
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError(f"a buffer ({offset}, {length}) outside the {size}-byte message body")
        if not compressed or length == 0:
            total += length
            continue
        if length < 8:
            raise ValueError(f"a compressed buffer of {length} bytes (no room for its length)")
        assert body is not None
        uncompressed = int(np.frombuffer(body, dtype="<i8", count=1, offset=offset)[0])
        if uncompressed < -1:
            raise ValueError(f"a compressed buffer claiming {uncompressed} bytes")
        total += length - 8 if uncompressed == -1 else uncompressed
    return total

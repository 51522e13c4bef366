"""Arrow IPC stream bytes of a trace while it is recorded (.arrows): a header (the schema message, with the
run metadata and the layouts known so far in its metadata) and one self-contained chunk per write (that
write's dictionary batches, then its record batch).

Each chunk is encoded by a fresh in-memory stream writer, so it never depends on dictionaries of an earlier
chunk that a failed write may have lost: a chunk's dictionaries replace the previous ones (the IPC stream
format's dictionary replacement), and the file is valid after any whole number of chunks. A crash mid-chunk
leaves a readable prefix (core/tracefile/reader_ipc.py stops at the first message that does not read).
"""
from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from moe_monitor import core

from .balance import LayoutSchedule
from .encode import step_batch
from .schema import schema_metadata, step_schema

END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the IPC stream's end marker (written at close)


class StreamEncoder:
    """header() and chunk(records) of one .arrows file of a run."""

    def __init__(self, meta: core.RunMeta, layouts: Sequence[core.LayoutRecord] = ()):
        self.meta = meta
        self.schedule = LayoutSchedule(meta, list(layouts))
        self.schema = step_schema(len(meta.layer_names), meta.num_experts, schema_metadata(meta, list(layouts)))
        self._header = self._stream_bytes(None)

    def add_layout(self, rec: core.LayoutRecord) -> None:
        """A layout record that arrived after the header: used for the balancedness of later chunks."""
        self.schedule.add(rec)

    def header(self) -> bytes:
        return self._header

    def chunk(self, records: Sequence[core.StepRecord]) -> bytes:
        """The IPC messages of one record batch of records (with its dictionaries); b"" for no records."""
        if not records:
            return b""
        whole = self._stream_bytes(step_batch(records, self.schema, self.schedule))
        return whole[len(self._header):]

    def _stream_bytes(self, batch: pa.RecordBatch | None) -> bytes:
        sink = pa.BufferOutputStream()
        writer = pa.ipc.new_stream(sink, self.schema)
        if batch is not None:
            writer.write_batch(batch)
        writer.close()
        data = sink.getvalue().to_pybytes()
        assert data.endswith(END_OF_STREAM)
        return data[:-len(END_OF_STREAM)]

"""Just enough of the FlatBuffers wire format to read an Arrow IPC message's header (Message.fbs: Message,
RecordBatch, DictionaryBatch, BodyCompression) without decoding its body: tables, scalars, sub-tables and
vectors of structs, every offset checked against the buffer (a bad one is a ValueError, never a read outside).

A table starts with an int32 soffset back to its vtable; the vtable holds uint16 [vtable bytes, table bytes,
field offsets...], 0 for a field that is absent (its default applies). Offsets to sub-tables and vectors are
uint32 relative to where they are stored; a vector is a uint32 length followed by its elements.
"""
from __future__ import annotations

import struct


class FlatTable:
    """A FlatBuffers table at byte pos of buf."""

    def __init__(self, buf: bytes, pos: int):
        self.buf = buf
        self.pos = pos
        self.vtable = pos - _read(buf, "<i", pos)
        self.vtable_bytes = _read(buf, "<H", self.vtable)

    def _offset(self, field: int) -> int:
        slot = 4 + 2 * field
        return 0 if slot + 2 > self.vtable_bytes else _read(self.buf, "<H", self.vtable + slot)

    def scalar(self, field: int, fmt: str, default: int) -> int:
        """The scalar field (struct format fmt, e.g. "<q"), default when absent."""
        off = self._offset(field)
        return default if off == 0 else _read(self.buf, fmt, self.pos + off)

    def table(self, field: int) -> FlatTable | None:
        """The sub-table field, None when absent."""
        off = self._offset(field)
        if off == 0:
            return None
        where = self.pos + off
        return FlatTable(self.buf, where + _read(self.buf, "<I", where))

    def struct_vector(self, field: int, fmt: str) -> list[tuple[int, ...]]:
        """The vector of structs field (each struct one struct format, e.g. "<qq"), [] when absent."""
        off = self._offset(field)
        if off == 0:
            return []
        where = self.pos + off
        start = where + _read(self.buf, "<I", where)
        count = _read(self.buf, "<I", start)
        size = struct.calcsize(fmt)
        if start + 4 + count * size > len(self.buf):
            raise ValueError(f"a vector of {count} entries runs past its {len(self.buf)}-byte message header")
        return [struct.unpack_from(fmt, self.buf, start + 4 + i * size) for i in range(count)]


def root_table(buf: bytes) -> FlatTable:
    """The root table of a FlatBuffers buffer."""
    return FlatTable(buf, _read(buf, "<I", 0))


def _read(buf: bytes, fmt: str, pos: int) -> int:
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise ValueError(f"an offset ({pos}) outside its {len(buf)}-byte message header")
    return struct.unpack_from(fmt, buf, pos)[0]

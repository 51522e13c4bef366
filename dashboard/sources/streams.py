"""Small helpers for reading Redis streams defensively, shared by the aggregate and rollup readers.

A stream entry, as redis-py returns it without decoding, is (entry id, {field: value}); an entry id is
b"<ms>-<seq>". Nothing read is trusted: decode_into() turns an entry that does not decode (whatever the
exception) into one bad record of the batch, named by kind and id, and goes on with the rest.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar, cast

# One stream entry as redis-py returns it without decoding: (entry id, {field: value}).
StreamEntry = tuple[bytes, dict[bytes, bytes]]
ENTRY_OVERHEAD_BYTES = 200  # what an entry costs beyond its payloads (ids, field names, framing), roughly
MAX_ERROR_CHARS = 500

T = TypeVar("T")


class Tally(Protocol):
    """What decode_into() counts into (a dashboard.sources.base.Batch, a rollup batch)."""

    bad_records: int
    last_error: str


def entries(reply: object) -> list[StreamEntry]:
    """An XRANGE / XREVRANGE reply as typed entries (redis-py types its replies loosely)."""
    return cast("list[StreamEntry]", reply or [])


def exclusive(entry_id: bytes) -> bytes:
    """entry_id as an exclusive range bound: XRANGE min= starts after it, XREVRANGE max= continues below it."""
    return b"(" + entry_id


def id_key(entry_id: bytes) -> tuple[int, int]:
    """b"<ms>-<seq>" -> (ms, seq), for ordering ids."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def id_ms(entry_id: bytes) -> int:
    """The milliseconds part of an entry id."""
    return id_key(entry_id)[0]


def id_text(entry_id: object) -> str:
    return entry_id.decode("ascii", "replace") if isinstance(entry_id, (bytes, bytearray)) else str(entry_id)


def entry_bytes(fields: dict) -> int:
    """Bytes an entry took on the wire, roughly: its binary payloads plus ENTRY_OVERHEAD_BYTES."""
    return ENTRY_OVERHEAD_BYTES + sum(len(v) for v in fields.values() if isinstance(v, (bytes, bytearray)))


def why(exc: BaseException) -> str:
    """An exception as one short line: the message of a ValueError, else the type and the message."""
    text = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


def decode_into(found: list[StreamEntry], decode: Callable[[dict], T], out: list[T], kind: str,
                tally: Tally) -> bytes | None:
    """Decode each entry (oldest first) into out; an entry that does not decode is one bad record of tally,
    named by kind and id. Returns the last entry id read (None when there were none)."""
    last_id = None
    for entry_id, fields in found:
        last_id = entry_id
        try:
            out.append(decode(fields))
        except Exception as exc:  # wire raises ValueError only; anything else is one bad record too
            tally.bad_records += 1
            tally.last_error = f"{kind} entry {id_text(entry_id)}: {why(exc)}"
    return last_id

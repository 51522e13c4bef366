"""Small helpers for reading Redis streams defensively, shared by the per-rank, aggregate and rollup readers.

A stream entry, as redis-py returns it without decoding, is (entry id, {field: value}); an entry id is
b"<ms>-<seq>". Nothing read is trusted: decode_into() turns an entry that does not decode (whatever the
exception) into one bad record of the batch, named by kind and id, and goes on with the rest.

Paging, bounded by entries a command, entries a poll and bytes a poll: page_backwards() collects the newest
entries of a stream (XREVRANGE, newest first) over as many polls as the byte budget needs; pages_after() reads
forwards after the last id seen (XRANGE) and tells when entries were trimmed before they were read.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar, cast

from moe_monitor import core

# One stream entry as redis-py returns it without decoding: (entry id, {field: value}).
StreamEntry = tuple[bytes, dict[bytes, bytes]]
ENTRY_OVERHEAD_BYTES = 200  # what an entry costs beyond its payloads (ids, field names, framing), roughly

T = TypeVar("T")


class Tally(Protocol):
    """What decode_into() counts into (a dashboard.sources.base.Batch, a rollup batch)."""

    bad_records: int
    last_error: str


class Paged(Protocol):
    """What pages_after() flags (a dashboard.sources.base.Batch)."""

    more: bool
    trimmed: bool


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
    """An entry id as text for a message (not ASCII: replaced, not bytes: str())."""
    return entry_id.decode("ascii", "replace") if isinstance(entry_id, (bytes, bytearray)) else str(entry_id)


def entry_bytes(fields: dict) -> int:
    """Bytes an entry took on the wire, roughly: its binary payloads plus ENTRY_OVERHEAD_BYTES."""
    return ENTRY_OVERHEAD_BYTES + sum(len(v) for v in fields.values() if isinstance(v, (bytes, bytearray)))


DECODED_BUDGET_BYTES = 32 << 20  # decoded bytes of a backlog handed over in one poll (the rest at the next ones)


def decoded_bytes(fields: dict, cell_bytes: int = 4) -> int:
    """Bytes an entry takes once decoded, roughly: its L x E counts of cell_bytes each (from its own L and E
    fields, before any decoding; 0 when they do not read as numbers) plus what it took on the wire."""
    try:
        cells = int(fields.get(b"L", fields.get("L", 0))) * int(fields.get(b"E", fields.get("E", 0)))
    except (TypeError, ValueError):
        cells = 0
    return entry_bytes(fields) + max(0, cells) * cell_bytes


def next_piece(found: list[StreamEntry], budget_bytes: int | None = None,
               cell_bytes: int = 4) -> tuple[list[StreamEntry], list[StreamEntry]]:
    """(the oldest entries of found whose decoded size stays within budget_bytes (None: DECODED_BUDGET_BYTES),
    at least one; the rest): a backlog goes to the window in pieces, so a poll never decodes a whole window of
    large records at once."""
    budget_bytes = DECODED_BUDGET_BYTES if budget_bytes is None else budget_bytes
    total = 0
    for i, (_, fields) in enumerate(found):
        total += decoded_bytes(fields, cell_bytes)
        if total > budget_bytes and i:
            return found[:i], found[i:]
    return found, []


def hand_over(handover: list[StreamEntry], batch: Paged, cell_bytes: int = 4
              ) -> tuple[list[StreamEntry], list[StreamEntry], bytes | None]:
    """The next piece of a collected backlog (next_piece): (piece, what is left, the id to read forwards from
    once nothing is left, else None); batch.more while something is left."""
    piece, rest = next_piece(handover, cell_bytes=cell_bytes)
    if rest:
        batch.more = True
    return piece, rest, None if rest else piece[-1][0]


def decode_into(found: list[StreamEntry], decode: Callable[[dict], T], out: list[T], kind: str,
                tally: Tally, last_id: bytes | None = None) -> bytes | None:
    """Decode each entry (oldest first) into out; an entry that does not decode is one bad record of tally,
    named by kind and id. Returns the last entry id read (last_id when there were none)."""
    for entry_id, fields in found:
        last_id = entry_id
        try:
            out.append(decode(fields))
        except Exception as exc:  # wire raises ValueError only; anything else is one bad record too
            tally.bad_records += 1
            tally.last_error = f"{kind} entry {id_text(entry_id)}: {core.why(exc)}"
    return last_id


def page_backwards(client: Any, key: str, backlog: list[StreamEntry], backlog_bytes: int, want: int,
                   page_entries: int, bytes_budget: int) -> tuple[bool, int]:
    """Extend backlog (the newest entries of the stream at key, newest first) with pages of XREVRANGE below
    its oldest entry, page_entries a command, until it holds want entries, the start of the stream is reached
    or bytes_budget more bytes were read. backlog_bytes: what backlog took so far (entry_bytes).
    Returns (done: want entries or the whole stream are in backlog, the bytes backlog takes now)."""
    budget = backlog_bytes + bytes_budget
    while len(backlog) < want and backlog_bytes < budget:
        upper = exclusive(backlog[-1][0]) if backlog else "+"
        count = min(page_entries, want - len(backlog))
        page = entries(client.xrevrange(key, max=upper, count=count))
        backlog.extend(page)
        backlog_bytes += sum(entry_bytes(f) for _, f in page)
        if len(page) < count:  # the start of the stream
            return True, backlog_bytes
    return len(backlog) >= want, backlog_bytes


def pages_after(client: Any, key: str, last_id: bytes, max_entries: int, page_entries: int, bytes_budget: int,
                batch: Paged) -> Iterator[list[StreamEntry]]:
    """The entries of the stream at key after last_id (b"0-0": from the start), oldest first, in non-empty
    pages of XRANGE, page_entries a command, up to max_entries entries and bytes_budget bytes; once the pages
    are all taken, batch.more says whether a bound stopped the reading. When the stream's first entry is the
    first one read and newer than last_id (not b"0-0"), entries were trimmed before they were read:
    batch.trimmed (left True when it already was)."""
    taken = spent = 0
    while taken < max_entries and spent < bytes_budget:
        count = min(page_entries, max_entries - taken)
        page = entries(client.xrange(key, min=exclusive(last_id), count=count))
        if page and not taken and last_id != b"0-0":
            first = entries(client.xrange(key, min="-", max="+", count=1))
            batch.trimmed = batch.trimmed or (bool(first) and first[0][0] == page[0][0]
                                              and id_key(first[0][0]) > id_key(last_id))
        taken += len(page)
        spent += sum(entry_bytes(f) for _, f in page)
        if page:
            last_id = page[-1][0]
            yield page
        if len(page) < count:
            return
    batch.more = True

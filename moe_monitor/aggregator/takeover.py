"""What an aggregator reads from Redis when it takes a run over (I/O, no decisions beyond reading): which
steps of the current epoch its predecessors wrote (the tail of the aggregate stream), the last rollup bucket
of each resolution, the aggregates to replay into the open rollups, and the pending entries of the consumer
group it claims (XAUTOCLAIM). Every command touches one key of the run; Redis errors go to the caller.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from moe_monitor import core
from moe_monitor.core.assembly import entry_id_key

TAIL_PAGE = 256  # aggregate entries per XREVRANGE while reading the tail
REPLAY_PAGE = 128  # aggregate entries per XRANGE while replaying into the rollups
CLAIM_PAGE = 512  # entries per XAUTOCLAIM


@dataclass
class Tail:
    """The current epoch's steps in the newest `limit` aggregate entries.

    epoch: the epoch of the newest entry (or the one asked for); written: step -> bit mask of ranks written;
    horizon: steps below it may have been written before the tail (0 when the tail reaches the epoch's
    start); entries: ids of the epoch's entries read, oldest first, with their times (unix s); bad: entries
    that did not decode."""

    epoch: str | None
    written: dict[int, int] = field(default_factory=dict)
    horizon: int = 0
    entries: list[tuple[bytes, float]] = field(default_factory=list)
    bad: int = 0


def read_tail(client: core.Client, run: str, epoch: str | None, limit: int) -> Tail:
    """Page backwards through the aggregate stream until `limit` entries, the start of the stream, or an
    entry of another epoch. The tail is complete (horizon 0) when it reached an entry of another epoch, or the
    start of a stream never trimmed (XINFO STREAM: entries-added = length). Otherwise the horizon is the highest
    step among the oldest quarter of what was read: steps are written nearly in order (a step waits at most its
    deadline), so every step above it written before the tail's first entry would be a step held back by more
    than a quarter of the tail."""
    key = core.aggregate_key(run)
    tail = Tail(epoch=epoch)
    steps_newest_first: list[int] = []
    before: bytes | str = "+"
    complete = at_start = False
    while len(steps_newest_first) < limit and not complete and not at_start:
        count = min(TAIL_PAGE, limit - len(steps_newest_first))
        page = stream_entries(client.xrevrange(key, max=before, min="-", count=count))
        at_start = len(page) < count
        for entry_id, fields in page:
            try:
                rec = core.decode_aggregate(fields or {})
            except Exception:  # our own output, but a stream anyone may write: skip what does not decode
                tail.bad += 1
                continue
            if tail.epoch is None:
                tail.epoch = rec.instance
            if rec.instance != tail.epoch:
                complete = True
                break
            mask = 0
            for rank in rec.ranks_R.tolist():
                mask |= 1 << rank
            tail.written[rec.step] = tail.written.get(rec.step, 0) | mask
            steps_newest_first.append(rec.step)
            tail.entries.append((entry_id, rec.time_s))
        if page:
            before = b"(" + page[-1][0]
    tail.entries.reverse()
    if at_start and not complete:
        complete = never_trimmed(client, key)
    if not complete and steps_newest_first:
        oldest_quarter = steps_newest_first[-max(1, len(steps_newest_first) // 4):]
        tail.horizon = max(oldest_quarter) + 1
    tail.written = dict(sorted(tail.written.items()))
    return tail


def never_trimmed(client: core.Client, key: str) -> bool:
    """True when nothing was ever trimmed or deleted from the stream (False when Redis cannot tell)."""
    try:
        info = client.xinfo_stream(key)
    except redis.ResponseError:  # no such key: nothing in it, nothing trimmed
        return True
    added = info.get("entries-added")
    return added is not None and int(added) == int(info.get("length", -1))


def replay(client: core.Client, run: str, first_id: bytes, epoch: str | None) -> Iterator[core.AggregateRecord]:
    """The epoch's aggregate entries from first_id on, oldest first, decoded (entries that do not decode, or
    of another epoch, are skipped)."""
    key = core.aggregate_key(run)
    start: bytes = first_id
    while True:
        page = stream_entries(client.xrange(key, min=start, max="+", count=REPLAY_PAGE))
        for _, fields in page:
            try:
                rec = core.decode_aggregate(fields or {})
            except Exception:
                continue
            if rec.instance == epoch:
                yield rec
        if len(page) < REPLAY_PAGE:
            return
        start = b"(" + page[-1][0]


def last_bucket_start(client: core.Client, run: str, resolution_s: int) -> float:
    """Start (unix s) of the newest rollup bucket written at resolution_s; -inf when there is none."""
    page = stream_entries(client.xrevrange(core.rollup_key(run, resolution_s), count=1))
    if not page:
        return float("-inf")
    return entry_id_key(page[0][0])[0] / 1000.0


def claim(client: core.Client, run: str, group: str, consumer: str,
          count: int = CLAIM_PAGE) -> Iterator[tuple[list[tuple[bytes, dict]], list[bytes]]]:
    """XAUTOCLAIM every pending entry of the group (any consumer's, however recently delivered: the caller holds
    the lease, so their owner is gone) to `consumer`, page by page: (entries, ids of entries deleted from the
    stream meanwhile)."""
    key = core.steps_key(run)
    cursor: bytes | str = "0-0"
    while True:
        reply = client.xautoclaim(key, group, consumer, min_idle_time=0, start_id=cursor, count=count)
        cursor = reply[0]
        entries = stream_entries(reply[1])
        deleted = [bytes(x) for x in reply[2]] if len(reply) > 2 and reply[2] else []
        gone = [entry_id for entry_id, fields in entries if fields is None]
        yield [(entry_id, fields) for entry_id, fields in entries if fields is not None], deleted + gone
        if cursor in (b"0-0", "0-0") or not entries and not deleted:
            return


def entry_id_bytes(entry_id: object) -> bytes:
    """A stream entry id as redis-py hands it (bytes, or str with decode_responses) as bytes."""
    return entry_id if isinstance(entry_id, bytes) else str(entry_id).encode()


def stream_entries(reply) -> list[tuple[bytes, dict | None]]:
    """A stream reply as [(id bytes, fields or None)]."""
    out: list[tuple[bytes, dict | None]] = []
    for item in reply or ():
        entry_id, fields = item[0], item[1] if len(item) > 1 else None
        out.append((entry_id_bytes(entry_id), fields))
    return out

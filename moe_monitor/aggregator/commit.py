"""The commit path of an Aggregator round (worker.py): what waits for the next commit (_Outbox), the aggregates
and closed rollups encoded into it (queue), and the one MULTI/EXEC under WATCH of the lease that writes them
with the XACKs, the progress hash and the lease's expiry, a commit whose reply was lost checked by its tag
before anything is sent again (commit)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis
from redis.typing import EncodableT, FieldT

from moe_monitor import core

from .assembly import Output
from .options import GROUP
from .progress import encode_progress
from .reading import _text

if TYPE_CHECKING:
    from .worker import Aggregator

STATE_REFRESH_S = 2.0  # the instance map and retired set go into the progress hash at least this often


@dataclass
class _Outbox:
    """What waits for the next commit: encoded aggregates (in order), rollups (resolution, start, fields) and
    the ids of the step entries consumed."""

    records: list[dict] = field(default_factory=list)
    rollups: list[tuple[int, int, dict]] = field(default_factory=list)
    acks: list[bytes] = field(default_factory=list)

    def sizes(self) -> tuple[int, int, int]:
        return len(self.records), len(self.rollups), len(self.acks)

    def drop(self, sizes: tuple[int, int, int]) -> None:
        """Forget the first (records, rollups, acks): they landed."""
        del self.records[:sizes[0]], self.rollups[:sizes[1]], self.acks[:sizes[2]]

    def __bool__(self) -> bool:
        return bool(self.records or self.rollups or self.acks)


def queue(agg: Aggregator, out: Output, now: float) -> None:
    """Encode what assembly wrote into the outbox, fold it into the rollups, and queue the rollups that
    closed."""
    wall = time.time()
    for emitted in out.emitted:
        try:
            fields = core.encode_aggregate(emitted.record)
        except ValueError as exc:  # cannot happen for records of decoded steps; counted, never a crash
            agg.counters.bad_records += 1
            agg.assembler.last_problem = f"step {emitted.record.step}: not written: {core.why(exc)}"
            agg._outbox.acks.extend(emitted.entry_ids)
            continue
        agg._outbox.records.append(fields)
        agg._outbox.acks.extend(emitted.entry_ids)
        agg.rollups.add(emitted.record, now, wall)
    agg._outbox.acks.extend(out.acks)
    for rollup in agg.rollups.close_due(now, wall, agg.assembler.oldest_pending_time_s()):
        try:
            agg._outbox.rollups.append((rollup.resolution_s, rollup.start_s, core.encode_rollup(rollup)))
        except ValueError as exc:  # a bucket beyond the format's bounds: reported, the others go on
            agg.last_error = f"rollup {rollup.resolution_s} s at {rollup.start_s} not written: {core.why(exc)}"


def commit(agg: Aggregator, now: float) -> None:
    """One MULTI/EXEC under WATCH of the lease: the aggregates (MAXLEN ~), the closed rollups (explicit ids,
    MINID to their retention), the XACKs, the progress hash and the lease's expiry. A commit whose outcome
    that raised (the connection broke during EXEC, or EXECABORT) is checked by its tag in the progress hash
    before anything is sent again: what landed is not written twice."""
    o, box = agg.options, agg._outbox
    if agg._inflight is not None:
        tag, sizes = agg._inflight
        if _text(agg.client.hget(agg.state_key, "commit")) == tag:
            box.drop(sizes)
        agg._inflight = None
    agg._seq += 1
    tag = f"{agg.consumer}/{agg._seq}"
    sizes = box.sizes()
    full_state = agg.assembler.version != agg._state_version or now - agg._state_at >= STATE_REFRESH_S
    assembler = agg.assembler
    state: dict[FieldT, EncodableT] = encode_progress(
        assembler.counters, agg.rollups.counters, epoch=assembler.epoch, last_step=assembler.last_step,
        pending_steps=assembler.pending_steps, lag_entries=agg.lag_entries, entries_per_s=agg._entries_per_s,
        consumer=agg.consumer, time_s=time.time(), commit=tag, last_problem=assembler.last_problem,
        instances=assembler.instance_of_rank if full_state else None,
        retired=list(assembler.retired) if full_state else None)
    version = assembler.version
    with agg._watchable_transaction() as pipe:
        pipe.watch(agg.lease.key)
        holder = pipe.get(agg.lease.key)
        if holder != agg.consumer.encode():
            pipe.reset()
            if holder is None and agg._keep_lease(now):
                agg._heartbeat = True  # taken again: the next round commits
            elif holder is not None:
                agg._lose("another aggregator holds it")
            return
        pipe.multi()
        for fields in box.records:
            pipe.xadd(agg.agg_key, fields, maxlen=o.agg_maxlen, approximate=True)
        for resolution, start, fields in box.rollups:
            retention = o.retention_1s_s if resolution == 1 else o.retention_60s_s
            pipe.xadd(core.rollup_key(agg.run, resolution), fields, id=f"{start * 1000}-0",
                  minid=max(0, (start - retention) * 1000), approximate=False)
        if box.acks:
            pipe.xack(agg.steps_key, GROUP, *box.acks)
        pipe.hset(agg.state_key, mapping=state)
        if assembler.epoch is None:
            pipe.hdel(agg.state_key, "epoch")
        pipe.pexpire(agg.lease.key, int(o.lease_s * 1000))
        agg._inflight = (tag, sizes)  # until it is known to have landed or not: the next commit checks
        try:
            replies = pipe.execute(raise_on_error=False)
        except redis.WatchError:
            agg._inflight = None
            agg._lose("taken by another aggregator while committing")
            return
    agg._inflight = None
    failed = [box.records[i] for i, reply in enumerate(replies[:sizes[0]]) if isinstance(reply, Exception)]
    for reply in replies[:sizes[0]]:
        if isinstance(reply, Exception):
            agg.last_error = f"aggregate not written ({core.why(reply)}): kept for the next commit"
    box.drop(sizes)
    box.records[:0] = failed
    agg.commits += 1
    agg._heartbeat = False
    agg._renew_at = now + o.lease_s / 3
    if full_state:
        agg._state_version, agg._state_at = version, now


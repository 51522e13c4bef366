"""The write side of an Aggregator's rounds (worker.py), with its own state: what waits for the next commit
(Outbox), the commit whose reply was lost (checked by its tag before anything is sent again), the commit sequence,
and when the full collector state last went into the progress hash. queue() encodes what assembly wrote and folds
it into the rollups; commit() is one MULTI/EXEC under WATCH of the lease that writes the aggregates and closed
rollups with the XACKs, the progress hash and the lease's expiry. What the lease's state means for the holder is
the worker's (commit() says what it found: CommitResult)."""
from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from redis.typing import EncodableT, FieldT

from moe_monitor import core
from moe_monitor.core.assembly import Assembler, Output
from moe_monitor.core.runwrite import exhausted_message, exhausted_stream

from .options import GROUP, AggregateOptions
from .progress import encode_progress, state_key
from .reading import text_of
from .rollup import RollupBuilder

STATE_REFRESH_S = 2.0  # the instance map and retired set go into the progress hash at least this often


class CommitResult(enum.Enum):
    WRITTEN = "written"  # the transaction ran (a reply that failed keeps its aggregate for the next commit)
    LEASE_FREE = "lease free"  # nobody holds the lease (it expired): nothing written
    LEASE_HELD = "lease held"  # another aggregator holds the lease: nothing written
    LEASE_TAKEN = "lease taken"  # the lease changed hands between WATCH and EXEC: nothing written


MAX_KEPT_RECORDS = 4096  # aggregates kept for the next commit while the stream refuses them (the oldest go)


@dataclass
class Outbox:
    """What waits for the next commit: encoded aggregates (in order), rollups (resolution, start, fields) and
    the ids of the step entries consumed."""

    records: list[dict] = field(default_factory=list)
    rollups: list[tuple[int, int, dict]] = field(default_factory=list)
    acks: list[bytes] = field(default_factory=list)
    nbytes: int = 0  # the encoded counts of the records and rollups (a wide run's read commits early past a bound)

    def sizes(self) -> tuple[int, int, int]:
        return len(self.records), len(self.rollups), len(self.acks)

    def drop(self, sizes: tuple[int, int, int]) -> None:
        """Forget the first (records, rollups, acks): they landed."""
        del self.records[:sizes[0]], self.rollups[:sizes[1]], self.acks[:sizes[2]]
        self.nbytes = sum(_counts_bytes(f) for f in self.records) + sum(_counts_bytes(f) for _, _, f in self.rollups)

    def __bool__(self) -> bool:
        return bool(self.records or self.rollups or self.acks)


def _counts_bytes(fields: dict) -> int:
    counts = fields.get("counts", b"")
    return len(counts) if isinstance(counts, (bytes, bytearray, str)) else 0


class Committer:
    """Writes one run's aggregates and rollups for an Aggregator. reset() forgets what is buffered (a holder that
    lost the lease leaves it to the next); commits counts for the life of the process."""

    def __init__(self, client: core.Client, run: str, consumer: str, options: AggregateOptions,
                 report: Callable[[str], None]):
        self.client, self.run, self.consumer, self.options = client, run, consumer, options
        self.report = report  # a problem that is the whole run's (the worker's last_error)
        self.agg_key, self.steps_key, self.state_key = core.aggregate_key(run), core.steps_key(run), state_key(run)
        self.lease_key = core.aggregator_key(run)
        self.commits = 0
        self.records_given_up = 0  # aggregates dropped because more than MAX_KEPT_RECORDS waited to be written
        self._seq = 0
        self.reset()

    def reset(self) -> None:
        self.outbox = Outbox()
        self._inflight: tuple[str, tuple[int, int, int]] | None = None  # (commit tag, sizes) of an unsure commit
        self._state_version, self._state_at = -1, -math.inf

    def queue(self, out: Output, now: float, assembler: Assembler, rollups: RollupBuilder) -> None:
        """Encode what assembly wrote into the outbox, fold it into the rollups, and queue the rollups that
        closed."""
        wall = time.time()
        box = self.outbox
        for emitted in out.emitted:
            try:
                fields = core.encode_aggregate(emitted.record)
            except ValueError as exc:  # cannot happen for records of decoded steps; counted, never a crash
                assembler.counters.bad_records += 1
                assembler.last_problem = f"step {emitted.record.step}: not written: {core.why(exc)}"
                box.acks.extend(emitted.entry_ids)
                continue
            box.records.append(fields)
            box.nbytes += _counts_bytes(fields)
            box.acks.extend(emitted.entry_ids)
            rollups.add(emitted.record, now, wall)
        box.acks.extend(out.acks)
        for rollup in rollups.close_due(now, wall, assembler.oldest_pending_time_s()):
            try:
                fields = core.encode_rollup(rollup)
                box.rollups.append((rollup.resolution_s, rollup.start_s, fields))
                box.nbytes += _counts_bytes(fields)
            except ValueError as exc:  # a bucket beyond the format's bounds: reported, the others go on
                self.report(f"rollup {rollup.resolution_s} s at {rollup.start_s} not written: {core.why(exc)}")

    def commit(self, now: float, assembler: Assembler, rollups: RollupBuilder, lag_entries: int,
               entries_per_s: float) -> CommitResult:
        """One MULTI/EXEC under WATCH of the lease: the aggregates (MAXLEN ~), the closed rollups (explicit ids,
        MINID to their retention), the XACKs, the progress hash and the lease's expiry. A commit whose outcome
        is unknown (the connection broke during EXEC, or EXECABORT) is checked by its tag in the progress hash
        before anything is sent again: what landed is not written twice."""
        o, box = self.options, self.outbox
        if self._inflight is not None:
            tag, sizes = self._inflight
            if text_of(self.client.hget(self.state_key, "commit")) == tag:
                box.drop(sizes)
            self._inflight = None
        self._seq += 1
        tag = f"{self.consumer}/{self._seq}"
        sizes = box.sizes()
        full_state = assembler.version != self._state_version or now - self._state_at >= STATE_REFRESH_S
        state: dict[FieldT, EncodableT] = encode_progress(
            assembler.counters, rollups.counters, epoch=assembler.epoch, last_step=assembler.last_step,
            pending_steps=assembler.pending_steps, lag_entries=lag_entries, entries_per_s=entries_per_s,
            consumer=self.consumer, time_s=time.time(), commit=tag, last_problem=assembler.last_problem,
            instances=assembler.instance_of_rank if full_state else None,
            retired=list(assembler.retired) if full_state else None,
            held=assembler.held_ranks if full_state else None)
        version = assembler.version
        with self._watchable_transaction() as pipe:
            pipe.watch(self.lease_key)
            holder = pipe.get(self.lease_key)
            if holder != self.consumer.encode():
                pipe.reset()
                return CommitResult.LEASE_FREE if holder is None else CommitResult.LEASE_HELD
            pipe.multi()
            for fields in box.records:
                pipe.xadd(self.agg_key, fields, maxlen=o.agg_maxlen, approximate=True)
            for resolution, start, fields in box.rollups:
                retention = o.retention_1s_s if resolution == 1 else o.retention_60s_s
                pipe.xadd(core.rollup_key(self.run, resolution), fields, id=f"{start * 1000}-0",
                          minid=max(0, (start - retention) * 1000), approximate=False)
            if box.acks:
                pipe.xack(self.steps_key, GROUP, *box.acks)
            pipe.hset(self.state_key, mapping=state)
            if assembler.epoch is None:
                pipe.hdel(self.state_key, "epoch")
            pipe.pexpire(self.lease_key, int(o.lease_s * 1000))
            self._inflight = (tag, sizes)  # until it is known to have landed or not: the next commit checks
            try:
                replies = pipe.execute(raise_on_error=False)
            except redis.WatchError:
                self._inflight = None
                return CommitResult.LEASE_TAKEN
        self._inflight = None
        failed = [box.records[i] for i, reply in enumerate(replies[:sizes[0]]) if isinstance(reply, Exception)]
        errors = [reply for reply in replies[:sizes[0]] if isinstance(reply, Exception)]
        box.drop(sizes)
        box.records[:0] = failed
        if len(box.records) > MAX_KEPT_RECORDS:  # a stream refusing every entry must not fill this process
            gone = len(box.records) - MAX_KEPT_RECORDS
            del box.records[:gone]
            self.records_given_up += gone
        if errors:
            why = (exhausted_message(self.agg_key) if exhausted_stream(errors[0]) else
                   f"aggregate not written ({core.why(errors[0])})")
            given_up = f"; {self.records_given_up} given up" if self.records_given_up else ""
            self.report(f"{why}: {len(box.records)} kept for the next commit{given_up}")
        self.commits += 1
        if full_state:
            self._state_version, self._state_at = version, now
        return CommitResult.WRITTEN

    def _watchable_transaction(self):
        """redis-py's own transactional pipeline of the client in use (a single Redis or a Redis Cluster): WATCH,
        then commands that answer at once, then MULTI ... EXEC on one connection. (core.AutoClient.pipeline() on a
        cluster queues every command, WATCH included, so the client it decided is asked for one.)"""
        resolve = getattr(self.client, "resolve", None)
        native = resolve() if callable(resolve) else self.client
        return native.pipeline(transaction=True)

"""Reading a run's aggregated steps: core.aggregate_key(run), one core.AggregateRecord per step with its ranks
summed once by `moe-monitor aggregate`, plus a "late" entry for ranks that arrived after their step was written
(the present-rank sets of a step's entries are disjoint: the window sums them). RedisSource uses one
AggregateReader per source and reads it in place of the per-rank steps while `in_use`.

in_use, decided again every CHECK_S: the aggregate has entries and either an aggregator holds the run's lease
or no per-rank step is left; a held lease whose aggregate is STALL_S behind the per-rank steps is a stall
(`stall_note`), and the ranks are summed by the reader until it moves again. Paging as RedisSource's; Redis
errors are raised to the caller. Details: docs/dashboard.md, "How the sources read".
"""
from __future__ import annotations

import time
from typing import Any

from moe_monitor import core
from moe_monitor.dashboard.sources.base import Batch
from moe_monitor.dashboard.sources.streams import StreamEntry, decode_into, hand_over, page_backwards, pages_after

CHECK_S = 5.0  # how often whether the aggregate is in use is decided again
STALL_S = 15.0  # an aggregator that commits nothing this long while the collectors write is stalled
PAGE_ENTRIES = 100  # entries a read (58 x 256 summed counts are ~20-60 kB an entry, compact)
TICK_BYTES_BUDGET = 24 << 20  # bytes a poll reads at most (the backlog goes on at the next poll)


def _ms_of(newest) -> int | None:
    """The unix ms (Redis's clock) in the id of XREVRANGE ... COUNT 1's entry; None for an empty stream."""
    if not newest:
        return None
    entry_id = newest[0][0]
    text = entry_id.decode("ascii", "replace") if isinstance(entry_id, bytes) else str(entry_id)
    try:
        return int(text.partition("-")[0])
    except ValueError:
        return None


class AggregateReader:
    """The aggregate stream of one run, read incrementally. client: a Redis client made by core.connect()
    (single Redis or Cluster: the run's keys share one slot); window_steps: entries the first polls read
    (the newest, oldest first once collected).

    in_use: whether the last check found the aggregate to read (see the module docstring); switches: how
    often that changed; checked_s: time.monotonic() of the last check; stalls: how often a held lease was
    found stalled; stall_note: why the aggregate is not read although a lease is held ("" otherwise)."""

    def __init__(self, client: Any, run: str, window_steps: int, check_every_s: float = CHECK_S,
                 page_entries: int = PAGE_ENTRIES, bytes_budget: int = TICK_BYTES_BUDGET, stall_s: float = STALL_S):
        if window_steps < 1:
            raise ValueError(f"window_steps must be at least 1, got {window_steps}")
        if page_entries < 1 or bytes_budget < 1:
            raise ValueError("page_entries and bytes_budget must be at least 1")
        self.client, self.run = client, core.check_run_name(run)
        self.window_steps, self.check_every_s = int(window_steps), float(check_every_s)
        self.page_entries, self.bytes_budget = int(page_entries), int(bytes_budget)
        self.in_use = False
        self.switches = 0
        self.checked_s = float("-inf")
        self.stall_s = float(stall_s)
        self.stalls = 0
        self.stall_note = ""
        self._last_id: bytes | None = None  # None until the newest window is read
        self._backlog: list[StreamEntry] = []  # newest first while paging backwards
        self._handover: list[StreamEntry] = []  # the collected backlog still to hand over, oldest first
        self._backlog_bytes = 0

    @property
    def key(self) -> str:
        return core.aggregate_key(self.run)

    def check(self) -> bool:
        """Decide now whether the aggregate is in use (one round trip); returns in_use. A change to in use
        starts the reading again from the newest window."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(core.aggregator_key(self.run))
        pipe.xlen(self.key)
        pipe.xlen(core.steps_key(self.run))
        pipe.xrevrange(self.key, count=1)
        pipe.xrevrange(core.steps_key(self.run), count=1)
        holder, aggregated, per_rank, newest_agg, newest_step = pipe.execute()
        now = time.monotonic()
        stalled = holder is not None and self._stalled(holder, _ms_of(newest_agg), _ms_of(newest_step))
        use = int(aggregated or 0) > 0 and ((holder is not None and not stalled) or int(per_rank or 0) == 0)
        if use != self.in_use:
            self.switches += 1
            self._last_id, self._backlog, self._backlog_bytes, self._handover = None, [], 0, []
        self.in_use = use
        self.checked_s = now
        return use

    def _stalled(self, holder: object, aggregate_ms: int | None, steps_ms: int | None) -> bool:
        """Whether the per-rank steps' newest entry is stall_s newer than the aggregate's (sets stall_note;
        counts a new stall once). Times: the unix ms of the entry ids (Redis's clock)."""
        if aggregate_ms is None or steps_ms is None:
            self.stall_note = ""
            return False
        quiet_s = (steps_ms - aggregate_ms) / 1000
        if quiet_s < self.stall_s:
            self.stall_note = ""
            return False
        if not self.stall_note:
            self.stalls += 1
        name = holder.decode("utf-8", "replace") if isinstance(holder, bytes) else str(holder)
        self.stall_note = (f"the aggregator lease is held by {name[:80]!r} and the aggregate has gained nothing for "
                           f"{quiet_s:.0f} s while the collectors keep writing: the ranks are summed here")
        return True

    def read(self, batch: Batch, max_entries: int) -> bool:
        """When the aggregate is in use: read what arrived since the last call into batch.aggregates (oldest
        first; bad entries counted in batch.bad_records, batch.more / batch.trimmed set) and return True.
        Otherwise read nothing and return False. Redis errors are raised."""
        if time.monotonic() - self.checked_s >= self.check_every_s:
            self.check()
        if not self.in_use:
            return False
        if self._last_id is None:
            self._take(self._read_backlog(batch), batch)
        else:
            self._read_forward(max(1, int(max_entries)), batch)
        return True

    @staticmethod
    def _take(found: list[StreamEntry], batch: Batch) -> None:
        decode_into(found, core.decode_aggregate, batch.aggregates, "aggregate", batch)

    @property
    def reading_backlog(self) -> bool:
        """True while the newest window is being paged in (nothing handed over yet)."""
        return self.in_use and self._last_id is None

    def _read_backlog(self, batch: Batch) -> list[StreamEntry]:
        """Page backwards through the newest window_steps entries; [] (batch.more) until all are read (or the
        start of the stream), then them oldest first, a piece of at most streams.DECODED_BUDGET_BYTES decoded
        a poll (batch.more until the last)."""
        if not self._handover:
            done, self._backlog_bytes = page_backwards(self.client, self.key, self._backlog, self._backlog_bytes,
                                                       self.window_steps, self.page_entries, self.bytes_budget)
            if not done:
                batch.more = True
                return []
            self._handover, self._backlog, self._backlog_bytes = self._backlog[::-1], [], 0
            if not self._handover:
                self._last_id = b"0-0"
                return []
        piece, self._handover, last_id = hand_over(self._handover, batch, cell_bytes=8)  # int64 sums
        if last_id is not None:
            self._last_id = last_id
        return piece

    def _read_forward(self, max_entries: int, batch: Batch) -> None:
        """Entries after the last id seen, in pages, up to max_entries and the byte budget, each page decoded
        into the batch as it arrives (a Redis error on a later page loses nothing already read)."""
        for page in pages_after(self.client, self.key, self._last_id or b"0-0", max_entries, self.page_entries,
                                self.bytes_budget, batch):
            self._take(page, batch)
            self._last_id = page[-1][0]

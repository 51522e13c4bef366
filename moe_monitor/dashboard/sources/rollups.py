"""Reading a run's rollups: core.rollup_key(run, resolution_s), one core.RollupRecord per 1 s or 60 s bucket of
aggregated steps, entry id = the bucket's start in unix ms (a time range is an XRANGE), kept for hours by the
aggregator. The dashboard's Resolution setting reads them (dashboard.live.rollups).

RollupSource.poll() reads the newest span_s seconds, then forwards after the last id seen; read_range() any
[start_ms, end_ms]; available_resolutions() which resolutions a run has. Reads are bounded (PAGE_ENTRIES,
max_entries, bytes_budget: RollupBatch.more); a bad entry is one bad record; Redis errors are raised to the caller.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moe_monitor import core
from moe_monitor.dashboard.sources.streams import decode_into, entries, entry_bytes, exclusive, id_ms

PAGE_ENTRIES = 100  # entries a read (a 58 x 256 bucket is ~20-60 kB, compact)
MAX_ENTRIES = 4096  # entries a poll at most
BYTES_BUDGET = 24 << 20  # bytes a poll reads at most


@dataclass
class RollupBatch:
    """What one read brought: buckets oldest first; bad_records: entries that did not decode (last_error: why
    the latest was skipped); more: a bound stopped the read, more entries wait for the next poll."""

    rollups: list[core.RollupRecord] = field(default_factory=list)
    bad_records: int = 0
    last_error: str = ""
    more: bool = False


def available_resolutions(client: Any, run: str) -> tuple[int, ...]:
    """The rollup resolutions (seconds, ascending, of core.ROLLUP_RESOLUTIONS_S) whose stream holds entries for
    the run. One round trip. Raises the client's errors when Redis is unreachable."""
    pipe = client.pipeline(transaction=False)
    for resolution in core.ROLLUP_RESOLUTIONS_S:
        pipe.xlen(core.rollup_key(run, resolution))
    lengths = pipe.execute()
    return tuple(res for res, length in zip(core.ROLLUP_RESOLUTIONS_S, lengths) if int(length or 0) > 0)


class RollupSource:
    """One resolution of one run's rollups over the newest span_s seconds, read incrementally. client: a Redis
    client made by core.connect(); resolution_s: one of core.ROLLUP_RESOLUTIONS_S; span_s: seconds of history
    (a multiple of resolution_s, at least one bucket)."""

    def __init__(self, client: Any, run: str, resolution_s: int, span_s: int, max_entries: int = MAX_ENTRIES,
                 bytes_budget: int = BYTES_BUDGET, page_entries: int = PAGE_ENTRIES):
        if resolution_s not in core.ROLLUP_RESOLUTIONS_S:
            raise ValueError(f"rollup resolution must be one of {core.ROLLUP_RESOLUTIONS_S} s, got {resolution_s}")
        if span_s < resolution_s:
            raise ValueError(f"a span of {span_s} s holds no {resolution_s} s bucket")
        if max_entries < 1 or bytes_budget < 1 or page_entries < 1:
            raise ValueError("max_entries, bytes_budget and page_entries must be at least 1")
        self.client, self.run = client, core.check_run_name(run)
        self.resolution_s, self.span_s = int(resolution_s), int(span_s) // int(resolution_s) * int(resolution_s)
        self.max_entries, self.bytes_budget, self.page_entries = int(max_entries), int(bytes_budget), int(page_entries)
        self._last_id: bytes | None = None  # None until the first poll found the newest bucket

    @property
    def key(self) -> str:
        return core.rollup_key(self.run, self.resolution_s)

    @property
    def buckets(self) -> int:
        """Buckets the span holds."""
        return self.span_s // self.resolution_s

    def poll(self) -> RollupBatch:
        """The buckets that arrived since the last poll (the first poll: those of the newest span_s seconds),
        oldest first, within the bounds."""
        batch = RollupBatch()
        if self._last_id is None:
            newest = entries(self.client.xrevrange(self.key, count=1))
            if not newest:
                return batch
            start_ms = id_ms(newest[0][0]) - (self.span_s - self.resolution_s) * 1000
            self._read(max(0, start_ms), "+", batch, inclusive=True)
        else:
            self._read(self._last_id, "+", batch, inclusive=False)
        return batch

    def read_range(self, start_ms: int, end_ms: int) -> RollupBatch:
        """The buckets whose start lies in [start_ms, end_ms] (unix ms), oldest first, within the bounds
        (RollupBatch.more when they stopped it). Does not move the poll's position. ValueError for an empty
        range."""
        if end_ms < start_ms:
            raise ValueError(f"empty range {start_ms}..{end_ms}")
        batch = RollupBatch()
        self._read(max(0, int(start_ms)), int(end_ms), batch, inclusive=True, move=False)
        return batch

    def _read(self, lower: bytes | int, upper: str | int, batch: RollupBatch, inclusive: bool,
              move: bool = True) -> None:
        """Pages of XRANGE from lower (ms, or an entry id: exclusive unless inclusive) to upper, each decoded into
        batch as it arrives, up to max_entries and bytes_budget."""
        low: bytes | int = lower if inclusive or not isinstance(lower, bytes) else exclusive(lower)
        taken = spent = 0
        while taken < self.max_entries and spent < self.bytes_budget:
            count = min(self.page_entries, self.max_entries - taken)
            page = entries(self.client.xrange(self.key, min=low, max=upper, count=count))
            decode_into(page, self._decode, batch.rollups, f"rollup {self.resolution_s} s", batch)
            taken += len(page)
            spent += sum(entry_bytes(f) for _, f in page)
            if page:
                low = exclusive(page[-1][0])
                if move:
                    self._last_id = page[-1][0]
            elif move and self._last_id is None:
                self._last_id = b"0-0"  # nothing in the span yet: read on from the start
            if len(page) < count:
                return
        batch.more = True

    def _decode(self, fields: dict) -> core.RollupRecord:
        rec = core.decode_rollup(fields)
        if rec.resolution_s != self.resolution_s:
            raise ValueError(f"a {rec.resolution_s} s bucket in the {self.resolution_s} s stream")
        if rec.run != self.run:
            raise ValueError(f"a bucket of run {rec.run!r} in the stream of {self.run!r}")
        return rec

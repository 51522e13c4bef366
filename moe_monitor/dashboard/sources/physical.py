"""Reading a run's physical records (moe:{R}:physical, core.PhysicalRecord), a poll at a time (the dashboard's
live.physical.MeasuredFeed puts them into its ring).

The first poll reads the newest entries (XREVRANGE, at most FIRST_ENTRIES: the window's steps for every rank,
capped), later polls what came after the last id read (XRANGE, PAGE_ENTRIES a command, at most PAGES_A_POLL
commands a poll: an entry of DeepSeek-V3's 58 x 288 slots is 67 kB, so a poll reads at most ~70 MB). Nothing
read is trusted: an entry that does not decode is one bad record (bad_records, last_error) and the rest go on. A Redis error is kept in `error` (the next poll tries
again); a stream that was emptied under the reader (a Redis restarted empty: its newest id is below the last one
read) is read from its start again.
"""
from __future__ import annotations

from typing import Any

from moe_monitor import core
from moe_monitor.dashboard.sources.streams import StreamEntry, entries, exclusive, id_key, id_text

FIRST_ENTRIES = 1024   # newest entries the first poll reads, at most
PAGE_ENTRIES = 256     # entries an XRANGE
PAGES_A_POLL = 4       # XRANGE commands a poll, at most


class PhysicalReader:
    """The physical records of `run` on `client` (a redis-py or core.connect client). poll() returns what is new;
    first_entries: how many of the newest entries the first poll reads (at most FIRST_ENTRIES)."""

    def __init__(self, client: Any, run: str):
        self.client, self.run, self.key = client, core.check_run_name(run), core.physical_key(run)
        self.bad_records = 0
        self.last_error = ""   # the latest bad record ("" when none)
        self.error = ""        # the latest poll's Redis failure ("" when it answered)
        self._last_id: bytes | None = None

    def poll(self, first_entries: int = FIRST_ENTRIES) -> list[core.PhysicalRecord]:
        """The records that are new since the last poll, oldest first ([] when Redis failed: see error)."""
        out: list[core.PhysicalRecord] = []
        try:
            if self._last_id is None:
                found = entries(self.client.xrevrange(self.key, count=max(1, min(FIRST_ENTRIES, first_entries))))
                self._take(found[::-1], out)
                self._last_id = found[0][0] if found else b"0-0"
                self.error = ""
                return out
            newest = entries(self.client.xrevrange(self.key, count=1))
            if newest and id_key(newest[0][0]) < id_key(self._last_id):
                self._last_id = b"0-0"  # the stream was emptied and written again: read it from the start
            for _ in range(PAGES_A_POLL):
                page = entries(self.client.xrange(self.key, min=exclusive(self._last_id), count=PAGE_ENTRIES))
                self._take(page, out)
                if page:
                    self._last_id = page[-1][0]
                if len(page) < PAGE_ENTRIES:
                    break
        except core.REDIS_ERRORS as exc:
            self.error = core.why(exc)
            return out
        self.error = ""
        return out

    def _take(self, found: list[StreamEntry], out: list[core.PhysicalRecord]) -> None:
        for entry_id, fields in found:
            try:
                out.append(core.decode_physical(fields))
            except Exception as exc:  # wire raises ValueError only; anything else is one bad record too
                self.bad_records += 1
                self.last_error = f"physical entry {id_text(entry_id)}: {core.why(exc)}"

"""Live source: one run's streams in Redis (steps, GPU samples, layouts, timings, health, metadata), read with
XRANGE after the last id seen in bounded polls; RedisSource is what the dashboard and the exporter watch.

The first polls read the newest window backwards and hand it over oldest first, in decoded pieces; later polls
read forwards. A single Redis or a Redis Cluster (core.connect decides); Redis errors and bad entries go to
health() and the batch's bad records, never raised. While an aggregator sums the run's ranks the steps come from
its stream instead (aggregate.py, Batch.aggregates). Paging, budgets, failover: docs/dashboard.md, "How the
sources read".
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import cast

import redis
from redis.exceptions import RedisClusterException

from moe_monitor import core
from moe_monitor.core.health import decode_health_rank, decode_health_report
from moe_monitor.dashboard.sources.aggregate import AggregateReader
from moe_monitor.dashboard.sources.base import Batch, Health
from moe_monitor.dashboard.sources.streams import (
    StreamEntry,
    decode_into,
    entries,
    exclusive,
    hand_over,
    page_backwards,
    pages_after,
)

# RedisClusterException is not a RedisError: a RedisCluster used directly raises it when no node answers (a
# core.connect client raises ConnectionError instead)
UNREACHABLE_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError, RedisClusterException)
META_REFRESH_S = 5.0
GPU_BACKLOG = 600  # NVML samples a poll at least; GPU_PER_RANK per rank where the run has more ranks
GPU_PER_RANK = 16  # 4 s of samples at the collector's fastest (0.25 s): a poll a second keeps up with margin
TIMING_PAGE = 4096  # timing entries a poll (58 layers: ~1.1 kB an entry)
LAYOUT_PAGE = 64  # layout entries a poll (a 58 x 288 map is ~67 kB; a stream holds ~1000)
PAGE_ENTRIES = 200
TICK_BYTES_BUDGET = 24 << 20
MAX_RUNS = 100  # runs listed
RUNS_READ = 1000  # entries of moe:runs read to find them (invalid ones are skipped)
MAX_HEALTH_RANKS = 1024  # health reports read per poll at most (a larger hash is not read: one bad record)


@dataclass(frozen=True)
class RunListing:
    """runs: (run, last time a collector wrote, unix s), newest first; skipped: entries of moe:runs left out
    (a name that is not UTF-8 or not a valid run name, a time that is not finite); beyond: valid runs older than
    the MAX_RUNS newest, not listed."""

    runs: list[tuple[str, float]]
    skipped: int
    beyond: int = 0


def read_runs(client: core.Client) -> RunListing:
    """The runs indexed in the moe:runs sorted set (the collectors ZADD their run there about once a second while
    they write), newest first, at most MAX_RUNS of the newest RUNS_READ entries. One ZREVRANGE, never a SCAN of the keyspace.
    Entries with an invalid or non-UTF-8 name or a non-finite time are skipped and counted. Raises the
    client's ConnectionError/TimeoutError when Redis is unreachable."""
    reply = cast("list[tuple[bytes, float]]", client.zrevrange(core.RUNS_KEY, 0, RUNS_READ - 1, withscores=True))
    runs: list[tuple[str, float]] = []
    skipped = beyond = 0
    for member, score in reply:
        try:
            name = core.check_run_name(member.decode() if isinstance(member, (bytes, bytearray)) else str(member))
            when = float(score)
        except (ValueError, TypeError):  # UnicodeDecodeError is a ValueError
            skipped += 1
            continue
        if not (math.isfinite(when) and abs(when) < core.MAX_TIME_S):
            skipped += 1
        elif len(runs) < MAX_RUNS:
            runs.append((name, when))
        else:
            beyond += 1
    return RunListing(runs, skipped, beyond)


def _time_or_none(value) -> float | None:
    """A sorted-set score as a time, None when absent or not a finite time (ZADD accepts +inf and -inf)."""
    try:
        when = float(value)
    except (TypeError, ValueError):
        return None
    return when if math.isfinite(when) and abs(when) < core.MAX_TIME_S else None


class RedisSource:
    """Source over moe:<run>:{steps,gpu,layouts,timings,meta,health} (keys and records: core/keys.py)."""

    def __init__(self, client: core.Client, url: str, run: str, window_steps: int):
        self.client, self.where, self.run = client, core.redact(url), core.check_run_name(run)
        if window_steps < 1:
            raise ValueError(f"window_steps must be at least 1, got {window_steps}")
        self.window_steps = int(window_steps)
        self._last_step_id: bytes | None = None  # None until the backlog is read
        self._backlog: list[StreamEntry] = []  # entries newest first while paging backwards
        self._backlog_bytes = 0
        self._last_gpu_id: bytes | None = None
        self._last_layout_id = b"0-0"  # the whole layout stream is read, oldest first
        self._last_timing_id: bytes | None = None  # None until the newest window of timings is read
        self._meta: core.RunMeta | None = None
        self._meta_error = ""
        self._meta_raw: bytes | None = None  # the bytes self._meta was decoded from (not decoded again)
        self._bad_meta_raw: bytes | None = None
        self._meta_read_at = float("-inf")
        self._bad_health: set[bytes] = set()  # digests of the bad health fields of the last poll
        self._health_fields = 0  # HLEN of the health hash at the last poll
        self._health = Health(reachable=False, where=self.where, error="not polled yet")
        self._handover: list[StreamEntry] = []  # the collected backlog still to hand over, oldest first
        self._aggregate = AggregateReader(client, self.run, self.window_steps)  # the aggregator's steps, when in use

    @property
    def stall_note(self) -> str:
        """Why the aggregate is not read although an aggregator lease is held ("" when it is, or none is)."""
        return self._aggregate.stall_note

    def poll(self, max_entries: int) -> Batch:
        batch = Batch()
        started = time.perf_counter()
        cursor = (self._last_step_id, list(self._backlog), self._backlog_bytes, list(self._handover))
        try:
            if self._last_step_id is None and self._meta is None and not self._backlog:
                self._read_meta(self.client.getrange(core.meta_key(self.run), 0, core.MAX_META_BYTES), batch)
            if self._aggregate.read(batch, max_entries):  # the aggregator sums the ranks: no per-rank steps
                step_entries, self._last_step_id, self._backlog, self._backlog_bytes = [], b"", [], 0
                self._handover = []
            elif not self._last_step_id:  # None, or b"" back from the aggregate: the newest window first
                step_entries = self._read_backlog(batch)
            else:
                step_entries = self._read_forward(self._last_step_id, max_entries, batch)
            pipe = self.client.pipeline(transaction=False)
            gpu, world = core.gpu_key(self.run), self._meta.world_size if self._meta else 1
            gpu_page = max(GPU_BACKLOG, GPU_PER_RANK * max(1, world))
            if self._last_gpu_id is None:
                pipe.xrevrange(gpu, count=gpu_page)
            else:
                pipe.xrange(gpu, min=exclusive(self._last_gpu_id), count=gpu_page)
            pipe.xrange(core.layouts_key(self.run), min=exclusive(self._last_layout_id), count=LAYOUT_PAGE)
            timings = core.timings_key(self.run)
            if self._last_timing_id is None:
                pipe.xrevrange(timings, count=min(TIMING_PAGE, self.window_steps * max(1, world)))
            else:
                pipe.xrange(timings, min=exclusive(self._last_timing_id), count=TIMING_PAGE)
            pipe.zscore(core.RUNS_KEY, self.run)
            pipe.hlen(core.health_key(self.run))
            # the reports ride in the same round trip while the hash was small at the last poll; a hash that
            # grew past the cap is fetched once at most, then only counted until it shrinks
            read_health = self._health_fields <= MAX_HEALTH_RANKS
            if read_health:
                pipe.hgetall(core.health_key(self.run))
            refresh_meta = time.monotonic() - self._meta_read_at > META_REFRESH_S
            if refresh_meta:
                pipe.getrange(core.meta_key(self.run), 0, core.MAX_META_BYTES)  # one byte more: too large
            gpu_entries, layout_entries, timing_entries, last_seen, hlen, *rest = pipe.execute()
            health_raw = rest.pop(0) if read_health else {}
            meta_raw = rest.pop(0) if refresh_meta else None
            health_fields = self._health_fields = int(hlen or 0)
            collectors = health_raw if health_fields <= MAX_HEALTH_RANKS else {}
        except core.REDIS_ERRORS as exc:
            # nothing read in this poll is handed over: put the cursor back so the next poll reads it again
            self._last_step_id, self._backlog, self._backlog_bytes, self._handover = cursor
            answered = not isinstance(exc, UNREACHABLE_ERRORS)
            self._health = Health(reachable=False, where=self.where, answered=answered,
                                  error=f"{type(exc).__name__}: {exc}")
            return batch
        except Exception:  # not a Redis failure (a bug): still nothing of this poll is lost to the next one
            self._last_step_id, self._backlog, self._backlog_bytes, self._handover = cursor
            raise
        if self._last_gpu_id is None:
            gpu_entries = gpu_entries[::-1]
        decode_into(step_entries, core.decode_step, batch.steps, "step", batch)
        self._last_gpu_id = decode_into(gpu_entries, core.decode_gpu_sample, batch.gpu_samples, "gpu", batch,
                                        self._last_gpu_id) or b"0-0"
        self._last_layout_id = decode_into(entries(layout_entries), core.decode_layout_record,
                                           batch.layouts, "layout", batch, self._last_layout_id) or b"0-0"
        self._take_timings(entries(timing_entries), batch)
        if refresh_meta:
            self._read_meta(meta_raw, batch)
        reports, bad = _collector_health(collectors)
        if health_fields > MAX_HEALTH_RANKS:
            bad[b"too-many-health-fields"] = (f"health hash holds {health_fields} fields, more than the "
                                             f"{MAX_HEALTH_RANKS} rank reports read; not read")
        for digest in bad.keys() - self._bad_health:  # a bad field counts once, not at every poll
            batch.bad_records += 1
            batch.last_error = bad[digest]
        self._bad_health = set(bad)
        self._health = Health(
            reachable=True, where=self.where, latency_ms=(time.perf_counter() - started) * 1e3,
            last_seen_s=_time_or_none(last_seen),
            collectors=reports,
            note="reading the aggregate backlog" if self._aggregate.reading_backlog else
            self._aggregate.stall_note if self._last_step_id is not None and self._aggregate.stall_note else
            "" if self._last_step_id is not None else f"reading the backlog ({len(self._backlog) + len(self._handover)} entries)",
        )
        return batch

    def _take_timings(self, found: list[StreamEntry], batch: Batch) -> None:
        """Decode the timing entries of this poll (the first poll's come newest first) into the batch."""
        first = self._last_timing_id is None
        if first:
            found = found[::-1]
        elif len(found) >= TIMING_PAGE:
            batch.more = True
        self._last_timing_id = decode_into(found, core.decode_timing, batch.timings, "timing", batch,
                                           self._last_timing_id) or b"0-0"

    def _read_backlog(self, batch: Batch) -> list[StreamEntry]:
        """Page backwards through the last window x world entries; [] (batch.more) until all are read,
        then them oldest first, a piece a poll (batch.more until the last)."""
        if not self._handover:
            world = self._meta.world_size if self._meta else 1
            done, self._backlog_bytes = page_backwards(self.client, core.steps_key(self.run), self._backlog,
                                                       self._backlog_bytes, self.window_steps * max(1, world),
                                                       PAGE_ENTRIES, TICK_BYTES_BUDGET)
            if not done:
                batch.more = True
                return []
            self._handover, self._backlog, self._backlog_bytes = self._backlog[::-1], [], 0
            if not self._handover:
                self._last_step_id = b"0-0"
                return []
        piece, self._handover, last_id = hand_over(self._handover, batch)
        if last_id is not None:
            self._last_step_id = last_id
        return piece

    def _read_forward(self, last_id: bytes, max_entries: int, batch: Batch) -> list[StreamEntry]:
        """Entries after last_id, in pages, up to max_entries and the byte budget."""
        found: list[StreamEntry] = []
        for page in pages_after(self.client, core.steps_key(self.run), last_id, max_entries, PAGE_ENTRIES,
                                TICK_BYTES_BUDGET, batch):
            found.extend(page)
            self._last_step_id = page[-1][0]
        return found

    def continues(self) -> bool:
        """Whether a copy of this source may poll on from where it stands (dashboard.live.seeds): the per-rank
        steps are read forwards (the newest window handed over, no aggregate feeding them), the step stream still
        holds the entry read last and the run's metadata is the bytes decoded. One round trip; False when Redis
        does not answer. A run written afresh under the same name fails it: its streams hold other entries."""
        if not self._last_step_id or self._backlog or self._handover or self._meta_raw is None or self._meta_error:
            return False
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.xrange(core.steps_key(self.run), self._last_step_id, self._last_step_id, count=1)
            pipe.getrange(core.meta_key(self.run), 0, core.MAX_META_BYTES)
            held, raw = pipe.execute()
        except core.REDIS_ERRORS:
            return False
        except RedisClusterException:
            return False
        return bool(held) and raw == self._meta_raw

    def _read_meta(self, raw, batch: Batch) -> None:
        """Decode the metadata's bytes (GETRANGE: b"" when absent) unless they are the ones decoded last."""
        self._meta_read_at = time.monotonic()
        if not raw or raw == self._meta_raw and self._meta is not None and not self._meta_error:
            return
        if raw == self._bad_meta_raw:  # counted once per bad version, not at every refresh
            return
        try:
            self._meta, self._meta_error, self._meta_raw = core.decode_meta(raw), "", raw
        except Exception as exc:  # wire raises ValueError only; anything else is a bad record too
            self._meta_error = f"run metadata ({core.meta_key(self.run)}) is unusable: {core.why(exc)}"
            self._bad_meta_raw = raw
            batch.bad_records += 1
            batch.last_error = self._meta_error

    def meta(self) -> core.RunMeta | None:
        return self._meta

    @property
    def meta_error(self) -> str:
        """Why the run's metadata could not be used ('' when it could or is absent)."""
        return self._meta_error

    def health(self) -> Health:
        return self._health


def _digest(field, value) -> bytes:
    data = bytes(field) + b"\0" + bytes(value) if isinstance(field, bytes) and isinstance(value, bytes) \
        else repr((field, value)).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def _collector_health(raw: dict) -> tuple[dict[int, dict], dict[bytes, str]]:
    """HGETALL of moe:<run>:health -> ({rank: report}, {digest of a bad field: why}). A report that does not
    decode is kept for its rank as {"last_error": "unreadable health entry (why)"}; a field that is not a rank
    is left out. Never raises."""
    out: dict[int, dict] = {}
    bad: dict[bytes, str] = {}
    for field, value in (raw or {}).items():
        try:
            rank = decode_health_rank(field)
        except ValueError as exc:
            bad[_digest(field, value)] = f"health entry: {exc}"
            continue
        try:
            out[rank] = decode_health_report(value)
        except ValueError as exc:
            bad[_digest(field, value)] = f"health entry of rank {rank}: {exc}"
            out[rank] = {"last_error": f"unreadable health entry ({exc})"}
    return out, bad

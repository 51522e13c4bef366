"""Live source: one run's streams in Redis, read with XRANGE after the last id seen (never XREAD BLOCK).

Reads go in pages of PAGE_ENTRIES entries, several per poll up to a byte budget (TICK_BYTES_BUDGET) and the
caller's max_entries, so one poll never pulls a whole stream (58 x 256 int32 counts are ~60 kB an entry).
The first polls page backwards through the last window_steps x world_size entries (world_size from the
run's metadata, 1 without it) and hand them over oldest first once collected; later polls continue
forwards from the last id seen. When the stream's first entry is newer than the last id seen, entries were
trimmed before they were read: the batch says so (Batch.trimmed). Every command goes through a client made
by wire.connect() with explicit timeouts, so an unreachable Redis costs one timeout, not a hang; any
Redis error reply (WRONGTYPE, MISCONF, OOM) is reported in health(), never raised.
"""
from __future__ import annotations

import json
import time
from typing import cast

import redis

import wire
from dashboard.sources.base import Batch, Health

REDIS_ERRORS = (redis.RedisError, OSError)
UNREACHABLE_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
META_REFRESH_S = 5.0
GPU_BACKLOG = 600
PAGE_ENTRIES = 200
TICK_BYTES_BUDGET = 24 << 20


# One stream entry as redis-py returns it without decoding: (entry id, {field: value}).
StreamEntry = tuple[bytes, dict[bytes, bytes]]


def _entries(reply: object) -> list[StreamEntry]:
    """An XRANGE / XREVRANGE reply as typed entries (redis-py types its replies loosely)."""
    return cast("list[StreamEntry]", reply or [])


def list_runs(client: redis.Redis) -> list[tuple[str, float]]:
    """Runs present in Redis, newest first: (run, last time a collector wrote, unix s).

    Reads the moe:runs sorted set; runs whose metadata exists but that are missing from it are listed
    with time 0. Raises the client's ConnectionError/TimeoutError when Redis is unreachable."""
    runs: dict[str, float] = {}
    for member, score in cast("list[tuple[bytes, float]]", client.zrevrange(wire.RUNS_KEY, 0, 99, withscores=True)):
        runs[member.decode() if isinstance(member, bytes) else member] = float(score)
    for key in client.scan_iter(match=f"{wire.KEY_PREFIX}:*:meta", count=500):
        runs.setdefault((key.decode() if isinstance(key, bytes) else key).split(":")[1], 0.0)
    return sorted(runs.items(), key=lambda item: -item[1])


def _after(entry_id: bytes) -> bytes:
    return b"(" + entry_id


def _id_key(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def _entry_bytes(fields: dict) -> int:
    return 200 + sum(len(v) for v in fields.values() if isinstance(v, (bytes, bytearray)))


class RedisSource:
    """Source over moe:<run>:{steps,gpu,meta,health} (keys and records: wire/)."""

    def __init__(self, client: redis.Redis, url: str, run: str, window_steps: int):
        self.client, self.where, self.run = client, wire.redact(url), wire.check_run_name(run)
        if window_steps < 1:
            raise ValueError(f"window_steps must be at least 1, got {window_steps}")
        self.window_steps = int(window_steps)
        self._last_step_id: bytes | None = None  # None until the backlog is read
        self._backlog: list[StreamEntry] = []  # entries newest first while paging backwards
        self._backlog_bytes = 0
        self._last_gpu_id: bytes | None = None
        self._meta: wire.RunMeta | None = None
        self._meta_error = ""
        self._bad_meta_raw = None
        self._meta_read_at = float("-inf")
        self._health = Health(reachable=False, where=self.where, error="not polled yet")

    def poll(self, max_entries: int) -> Batch:
        batch = Batch()
        started = time.perf_counter()
        try:
            if self._last_step_id is None and self._meta is None and not self._backlog:
                self._read_meta(self.client.get(wire.meta_key(self.run)), batch)
            if self._last_step_id is None:
                step_entries = self._read_backlog(batch)
            else:
                step_entries = self._read_forward(self._last_step_id, max_entries, batch)
            pipe = self.client.pipeline(transaction=False)
            gpu = wire.gpu_key(self.run)
            if self._last_gpu_id is None:
                pipe.xrevrange(gpu, count=GPU_BACKLOG)
            else:
                pipe.xrange(gpu, min=_after(self._last_gpu_id), count=GPU_BACKLOG)
            pipe.zscore(wire.RUNS_KEY, self.run)
            pipe.hgetall(wire.health_key(self.run))
            refresh_meta = time.monotonic() - self._meta_read_at > META_REFRESH_S
            if refresh_meta:
                pipe.get(wire.meta_key(self.run))
            replies = pipe.execute()
        except REDIS_ERRORS as exc:
            answered = not isinstance(exc, UNREACHABLE_ERRORS)
            self._health = Health(reachable=False, where=self.where, answered=answered,
                                  error=f"{type(exc).__name__}: {exc}")
            return batch
        gpu_entries, last_seen, collectors = replies[:3]
        if self._last_gpu_id is None:
            gpu_entries = gpu_entries[::-1]
        for entry_id, fields in step_entries:
            try:
                batch.steps.append(wire.decode_step(fields))
            except ValueError as exc:
                batch.bad_records += 1
                batch.last_error = f"step entry {entry_id.decode()}: {exc}"
        for entry_id, fields in gpu_entries:
            self._last_gpu_id = entry_id
            try:
                batch.gpu_samples.append(wire.decode_gpu_sample(fields))
            except ValueError as exc:
                batch.bad_records += 1
                batch.last_error = f"gpu entry {entry_id.decode()}: {exc}"
        if self._last_gpu_id is None:
            self._last_gpu_id = b"0-0"
        if refresh_meta:
            self._read_meta(replies[3], batch)
        self._health = Health(
            reachable=True, where=self.where, latency_ms=(time.perf_counter() - started) * 1e3,
            last_seen_s=None if last_seen is None else float(last_seen),
            collectors=_collector_health(collectors),
            note="" if self._last_step_id is not None else f"reading the backlog ({len(self._backlog)} entries)",
        )
        return batch

    def _read_backlog(self, batch: Batch) -> list[StreamEntry]:
        """Page backwards through the last window x world entries; [] (batch.more) until all are read,
        then all of them oldest first."""
        world = self._meta.world_size if self._meta else 1
        want = self.window_steps * max(1, world)
        budget = self._backlog_bytes + TICK_BYTES_BUDGET
        while len(self._backlog) < want and self._backlog_bytes < budget:
            before = _after(self._backlog[-1][0]) if self._backlog else "+"
            count = min(PAGE_ENTRIES, want - len(self._backlog))
            page = _entries(self.client.xrevrange(wire.steps_key(self.run), max=before, count=count))
            self._backlog.extend(page)
            self._backlog_bytes += sum(_entry_bytes(f) for _, f in page)
            if len(page) < count:  # the start of the stream
                break
        else:
            if len(self._backlog) < want:
                batch.more = True
                return []
        entries, self._backlog, self._backlog_bytes = self._backlog[::-1], [], 0
        self._last_step_id = entries[-1][0] if entries else b"0-0"
        return entries

    def _read_forward(self, last_id: bytes, max_entries: int, batch: Batch) -> list[StreamEntry]:
        """Entries after last_id, in pages, up to max_entries and the byte budget."""
        key, spent = wire.steps_key(self.run), 0
        entries: list[StreamEntry] = []
        while len(entries) < max_entries and spent < TICK_BYTES_BUDGET:
            count = min(PAGE_ENTRIES, max_entries - len(entries))
            page = _entries(self.client.xrange(key, min=_after(last_id), count=count))
            if page and not entries and last_id != b"0-0":
                first = _entries(self.client.xrange(key, min="-", max="+", count=1))
                batch.trimmed = bool(first) and _id_key(first[0][0]) > _id_key(last_id) \
                    and first[0][0] == page[0][0]
            entries.extend(page)
            spent += sum(_entry_bytes(f) for _, f in page)
            if page:
                last_id = self._last_step_id = page[-1][0]
            if len(page) < count:
                return entries
        batch.more = True
        return entries

    def _read_meta(self, raw, batch: Batch) -> None:
        self._meta_read_at = time.monotonic()
        if raw is None:
            return
        try:
            self._meta, self._meta_error = wire.decode_meta(raw), ""
        except ValueError as exc:
            self._meta_error = f"run metadata ({wire.meta_key(self.run)}) is unusable: {exc}"
            if raw != self._bad_meta_raw:  # counted once per bad version, not at every refresh
                self._bad_meta_raw = raw
                batch.bad_records += 1
                batch.last_error = self._meta_error

    def meta(self) -> wire.RunMeta | None:
        return self._meta

    @property
    def meta_error(self) -> str:
        """Why the run's metadata could not be used ('' when it could or is absent)."""
        return self._meta_error

    def health(self) -> Health:
        return self._health


def _collector_health(raw: dict) -> dict:
    """HGETALL of moe:<run>:health -> {rank: report}; an unreadable report is kept as an error, not raised."""
    out = {}
    for rank, value in (raw or {}).items():
        key = rank.decode() if isinstance(rank, bytes) else str(rank)
        try:
            report = json.loads(value)
        except (ValueError, TypeError):
            report = None
        if not isinstance(report, dict):
            report = {"last_error": "unreadable health entry"}
        out[int(key) if key.isdigit() else key] = report
    return out

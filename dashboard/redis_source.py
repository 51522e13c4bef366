"""Live source: one run's streams in Redis, read with XRANGE after the last id seen (never XREAD BLOCK).

The first poll starts window_steps x world_size entries before the end of the stream (enough to fill the
window; world_size from the run's metadata, 1 without it), later
polls continue from the last id seen with a COUNT cap. Every command goes through a client made by
redisconn.connect() with explicit timeouts, so an unreachable Redis costs one timeout, not a hang.
"""
from __future__ import annotations

import json
import time

import redis

import redisconn
import wire
from dashboard.source import Batch, Health

REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
META_REFRESH_S = 5.0
GPU_BACKLOG = 600


def list_runs(client: redis.Redis) -> list[tuple[str, float]]:
    """Runs present in Redis, newest first: (run, last time a collector wrote, unix s).

    Reads the moe:runs sorted set; runs whose metadata exists but that are missing from it are listed
    with time 0. Raises the client's ConnectionError/TimeoutError when Redis is unreachable."""
    runs = {}
    for name, score in client.zrevrange(wire.RUNS_KEY, 0, 99, withscores=True):
        runs[name.decode() if isinstance(name, bytes) else name] = float(score)
    for key in client.scan_iter(match=f"{wire.KEY_PREFIX}:*:meta", count=500):
        name = (key.decode() if isinstance(key, bytes) else key).split(":")[1]
        runs.setdefault(name, 0.0)
    return sorted(runs.items(), key=lambda item: -item[1])


def _after(entry_id: bytes) -> bytes:
    return b"(" + entry_id


class RedisSource:
    """Source over moe:<run>:{steps,gpu,meta,health} (see wire.py)."""

    def __init__(self, client: redis.Redis, url: str, run: str, window_steps: int):
        self.client, self.where, self.run = client, redisconn.redact(url), wire.check_run_name(run)
        if window_steps < 1:
            raise ValueError(f"window_steps must be at least 1, got {window_steps}")
        self.window_steps = int(window_steps)
        self._last_step_id: bytes | None = None
        self._last_gpu_id: bytes | None = None
        self._meta: wire.RunMeta | None = None
        self._meta_error = ""
        self._meta_read_at = float("-inf")
        self._health = Health(reachable=False, where=self.where, error="not polled yet")

    def poll(self, max_entries: int) -> Batch:
        batch = Batch()
        started = time.perf_counter()
        try:
            if self._last_step_id is None and self._meta is None:
                self._read_meta(self.client.get(wire.meta_key(self.run)))
            pipe = self.client.pipeline(transaction=False)
            steps, gpu = wire.steps_key(self.run), wire.gpu_key(self.run)
            if self._last_step_id is None:
                world = self._meta.world_size if self._meta else 1
                pipe.xrevrange(steps, count=self.window_steps * max(1, world))
            else:
                pipe.xrange(steps, min=_after(self._last_step_id), count=max_entries)
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
            self._health = Health(reachable=False, where=self.where, error=f"{type(exc).__name__}: {exc}")
            return batch
        step_entries, gpu_entries, last_seen, collectors = replies[:4]
        if self._last_step_id is None:
            step_entries = step_entries[::-1]
            gpu_entries = gpu_entries[::-1]
        elif len(step_entries) >= max_entries:
            batch.more = True
        for entry_id, fields in step_entries:
            self._last_step_id = entry_id
            try:
                batch.steps.append(wire.decode_step(fields))
            except ValueError as exc:
                batch.bad_records += 1
                batch.last_error = f"step entry {entry_id.decode()}: {exc}"
        if self._last_step_id is None:
            self._last_step_id = b"0-0"
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
            self._read_meta(replies[4])
        self._health = Health(
            reachable=True, where=self.where, latency_ms=(time.perf_counter() - started) * 1e3,
            last_seen_s=None if last_seen is None else float(last_seen),
            collectors=_collector_health(collectors),
        )
        return batch

    def _read_meta(self, raw) -> None:
        self._meta_read_at = time.monotonic()
        if raw is None:
            return
        try:
            self._meta, self._meta_error = wire.decode_meta(raw), ""
        except ValueError as exc:
            self._meta_error = str(exc)

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

"""The background publisher: the only place that touches Redis. The model's forward never waits on it.

Forward thread  --submit(step slot)-->  inbox (bounded by the host slots)  --> this thread:
    wait for the slot's copy, decode it, give the slot back, queue a StepRecord (bounded: when full the
    oldest is dropped and counted), XADD in pipelined batches with MAXLEN ~ trimming.
Redis down: the batch stays queued, retries back off from 0.1 s to 2 s; the dropped count travels in every
record and in the run's health hash. Metadata is (re)written after every (re)connection, so a Redis that
restarted empty gets it back.
"""
from __future__ import annotations

import collections
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import redis

import wire

log = logging.getLogger("collectors")


@dataclass
class StepJob:
    """A step waiting for the publisher: its host slot and the facts known on the host at end_step."""

    step: int
    time_s: float
    phase: str
    tokens: int | None      # set by the caller of end_step, else taken from facts / the device
    slot: object
    facts: object           # counter.StepFacts


class RedisSink:
    """Writes StepRecords, GpuSamples and health to one run's keys."""

    def __init__(self, url: str, meta: wire.RunMeta, maxlen: int, timeout_s: float):
        self.url, self.meta, self.maxlen = url, meta, maxlen
        self.client = wire.connect(url, timeout_s=timeout_s, retries=0)
        self.meta_json = wire.encode_meta(meta)
        self.needs_meta = True

    def write(self, records: list, samples: list, health: dict) -> None:
        run = self.meta.run
        pipe = self.client.pipeline(transaction=False)
        if self.needs_meta:
            pipe.set(wire.meta_key(run), self.meta_json)
        for rec in records:
            pipe.xadd(wire.steps_key(run), wire.encode_step(rec), maxlen=self.maxlen, approximate=True)
        for sample in samples:
            pipe.xadd(wire.gpu_key(run), wire.encode_gpu_sample(sample), maxlen=10_000, approximate=True)
        pipe.hset(wire.health_key(run), str(health["rank"]), json.dumps(health))
        pipe.zadd(wire.RUNS_KEY, {run: time.time()})
        pipe.execute()
        self.needs_meta = False

    def lost_connection(self) -> None:
        self.needs_meta = True


class Publisher:
    """Owns the background thread. `decode(job) -> StepRecord` runs on that thread."""

    def __init__(self, sink: RedisSink | None, decode: Callable[[StepJob], wire.StepRecord],
                 release: Callable[[object], None], rank: int, queue_steps: int = 1024,
                 batch: int = 256, extra_sinks: list | None = None, flush_interval_s: float = 0.1):
        self.sink, self.decode, self.release, self.rank = sink, decode, release, rank
        self.extra_sinks = extra_sinks or []
        self.queue_steps, self.batch, self.flush_interval_s = queue_steps, batch, flush_interval_s
        self.inbox: collections.deque[StepJob] = collections.deque()
        self.samples: collections.deque[wire.GpuSample] = collections.deque(maxlen=1000)
        self.pending: collections.deque[wire.StepRecord] = collections.deque()
        self.dropped_steps = 0          # steps lost (queue full while Redis was down, or no free slot)
        self.published_steps = 0
        self.last_error = ""
        self._health_sent = 0.0
        self.sink_error = ""            # the trace file's last failure (kept: Redis success does not clear it)
        self._unsent_samples: list[wire.GpuSample] = []
        self._wake = threading.Event()
        self._stop = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="moe-monitor-publisher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ called from other threads
    def submit(self, job: StepJob) -> None:
        """Hand over a finished step. Does not wake the thread: it publishes in batches every
        flush_interval_s, so the model's thread is not preempted for the GIL after every step."""
        self.inbox.append(job)

    def submit_sample(self, sample: wire.GpuSample) -> None:
        self.samples.append(sample)

    def count_dropped(self, n: int = 1) -> None:
        with self._lock:
            self.dropped_steps += n

    def close(self, timeout_s: float = 5.0) -> bool:
        """Publish what is queued (giving up after timeout_s), stop the thread. True if nothing was left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.inbox or self.pending or self.samples or self._unsent_samples):
            self._wake.set()
            time.sleep(0.01)
        self._stop = True
        self._wake.set()
        self._thread.join(max(0.1, deadline - time.monotonic()) + 1.0)
        left = len(self.inbox) + len(self.pending)
        if left:
            self.count_dropped(left)
            log.warning("moe monitor: %d steps were not published before close (%s)", left, self.last_error)
        return left == 0

    # ------------------------------------------------------------------ the thread
    def _drain_inbox(self) -> None:
        while self.inbox:
            job = self.inbox.popleft()
            try:
                record = self.decode(job)
            except Exception as exc:  # a bug here must not kill the thread
                self.last_error = f"decode failed: {exc}"
                self.count_dropped()
                continue
            finally:
                self.release(job.slot)
            with self._lock:
                record = _with_dropped(record, self.dropped_steps)
            for sink in self.extra_sinks:
                try:
                    sink.write_step(record)
                except Exception as exc:
                    self.sink_error = f"trace sink failed: {exc}"
            if self.sink is None:
                continue
            self.pending.append(record)
            while len(self.pending) > self.queue_steps:
                self.pending.popleft()
                self.count_dropped()

    def _health(self, in_flight: int = 0) -> dict:
        """Health as it will stand once the batch of `in_flight` records written with it has landed."""
        return {"rank": self.rank, "dropped_steps": self.dropped_steps,
                "published_steps": self.published_steps + in_flight, "queued": len(self.pending) - in_flight,
                "last_error": self.last_error or self.sink_error, "time_s": time.time()}

    def _run(self) -> None:
        backoff_s = 0.0
        while True:
            self._wake.wait(timeout=backoff_s or self.flush_interval_s)
            self._wake.clear()
            try:
                done, backoff_s = self._cycle(backoff_s)
            except Exception as exc:  # a bug must not end publishing for the rest of the process's life
                self.last_error = f"publisher error: {type(exc).__name__}: {exc}"
                log.exception("moe monitor publisher")
                done, backoff_s = self._stop, min(2.0, max(0.1, backoff_s * 2))
            if done:
                return

    def _cycle(self, backoff_s: float) -> tuple[bool, float]:
        """One round: decode finished steps, hand samples to the trace sinks, write one batch to Redis.
        Returns (stop now, next backoff)."""
        self._drain_inbox()
        fresh = [self.samples.popleft() for _ in range(len(self.samples))]
        for sink in self.extra_sinks:
            try:
                for sample in fresh:
                    sink.write_gpu(sample)
                sink.flush()
            except Exception as exc:  # a broken trace file must not stop publishing to Redis
                self.sink_error = f"trace sink failed: {exc}"
        samples, self._unsent_samples = self._unsent_samples + fresh, []
        if self.sink is None:
            return self._stop, 0.0
        if self._stop and not self.pending and not samples:
            return True, 0.0
        with self._lock:  # stamped now, not at decode: drops of steps queued behind it count before it lands
            dropped = self.dropped_steps
        records = [_with_dropped(self.pending[i], dropped) for i in range(min(self.batch, len(self.pending)))]
        if not records and not samples and time.monotonic() - self._health_sent < 1.0:
            return False, 0.0  # idle: health once a second, no round trip every tick
        try:
            self.sink.write(records, samples, self._health(len(records)))
        except (redis.RedisError, OSError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.sink.lost_connection()
            self._unsent_samples = samples[-1000:]  # kept for the next try (the newest thousand)
            return self._stop, min(2.0, max(0.1, backoff_s * 2))
        self._health_sent = time.monotonic()
        for _ in records:
            self.pending.popleft()
        self.published_steps += len(records)
        self.last_error = ""
        if len(self.pending) >= self.batch:
            self._wake.set()  # a backlog (after an outage): keep going without waiting
        return False, 0.0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def _with_dropped(record: wire.StepRecord, dropped: int) -> wire.StepRecord:
    if record.dropped_steps == dropped:
        return record
    return wire.StepRecord(**{**record.__dict__, "dropped_steps": dropped})

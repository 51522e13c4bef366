"""The background publisher: the only thread that writes to the sinks. The model's forward never waits on it.

Forward thread  --submit(StepJob)-->  inbox (bounded by the host slots)  --> this thread, every flush_interval_s:
    wait for the slot's copy, decode it, give the slot back, queue the StepRecord for every sink (each sink's
    queue holds at most queue_steps: when full the oldest is dropped and counted), then hand each sink one
    batch of at most `batch` records with the NVML samples that arrived and the publisher's health report.
A sink whose write raises keeps its batch and its samples (the newest thousand) and is tried again after a
backoff from 0.1 s doubling to 2 s; the other sinks go on. Every record carries the steps dropped before it
reached that sink (no free host slot, a failed decode, that sink's full queue), stamped when it is written.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import wire

from .counter import HostSlot, StepFacts
from .sinks import Sink

log = logging.getLogger("collectors")


@dataclass
class StepJob:
    """A step waiting for the publisher: its host slot and what the host knew of it at end_step."""

    step: int
    time_s: float
    phase: str
    tokens: int | None      # set by the caller of end_step, else taken from facts / the device
    slot: HostSlot
    facts: StepFacts


@dataclass
class _Outbox:
    """One sink and what waits for it."""

    sink: Sink
    pending: collections.deque[wire.StepRecord] = field(default_factory=collections.deque)
    samples: list[wire.GpuSample] = field(default_factory=list)
    dropped: int = 0          # records this sink's full queue dropped (and its leftovers at close)
    published: int = 0
    error: str = ""           # the last failed write's reason; cleared when a write lands
    backoff_s: float = 0.0
    retry_at: float = 0.0     # time.monotonic() before which a failed sink is not tried again
    health_sent: float = 0.0


class Publisher:
    """Owns the background thread. `decode(job) -> StepRecord` and `release(slot)` run on that thread."""

    def __init__(self, sinks: Sequence[Sink], decode: Callable[[StepJob], wire.StepRecord],
                 release: Callable[[HostSlot], None], rank: int, queue_steps: int = 1024, batch: int = 256,
                 flush_interval_s: float = 0.1):
        self._decode, self._release, self._rank = decode, release, rank
        self._queue_steps, self._batch, self._flush_interval_s = queue_steps, batch, flush_interval_s
        self._outboxes = [_Outbox(sink) for sink in sinks]
        self._inbox: collections.deque[StepJob] = collections.deque()
        self._samples: collections.deque[wire.GpuSample] = collections.deque(maxlen=1000)
        self._dropped = 0       # steps no sink got: no free host slot, a failed decode, left in the inbox
        self._error = ""        # the last failure outside the sinks; cleared once a write carrying it lands
        self._closing = False   # close() has begun: every sink is tried at once, backoff or not
        self._stop = False
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="moe-monitor-publisher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ called from other threads
    def submit(self, job: StepJob) -> None:
        """Hand over a finished step. Does not wake the thread: it publishes in batches every
        flush_interval_s, so the model's thread is not preempted for the GIL after every step."""
        self._inbox.append(job)

    def submit_sample(self, sample: wire.GpuSample) -> None:
        self._samples.append(sample)

    def count_dropped(self, n: int = 1) -> None:
        with self._lock:
            self._dropped += n

    @property
    def dropped_steps(self) -> int:
        """Steps missing from the sink that lacks the most."""
        return self._dropped + max((box.dropped for box in self._outboxes), default=0)

    @property
    def published_steps(self) -> int:
        """Steps every sink has."""
        return min((box.published for box in self._outboxes), default=0)

    @property
    def queued_steps(self) -> int:
        """Steps decoded and waiting for the sink with the longest queue."""
        return max((len(box.pending) for box in self._outboxes), default=0)

    @property
    def last_error(self) -> str:
        """Every failure that still stands ("" when none): each failing sink's, then the publisher's own."""
        return self._errors(None)

    def sink_stats(self) -> dict[str, dict[str, int | str]]:
        """Per sink (by name): published_steps, queued_steps, dropped_steps, last_error."""
        return {box.sink.name: {"published_steps": box.published, "queued_steps": len(box.pending),
                                "dropped_steps": self._dropped + box.dropped, "last_error": box.error}
                for box in self._outboxes}

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout_s: float = 5.0) -> bool:
        """Publish what is queued (giving up after timeout_s), stop the thread, close every sink. True if
        nothing was left."""
        deadline = time.monotonic() + timeout_s
        self._closing = True
        while time.monotonic() < deadline and (self._inbox or self._samples or any(
                box.pending or box.samples for box in self._outboxes)):
            self._wake.set()
            time.sleep(0.01)
        self._stop = True
        self._wake.set()
        self._thread.join(max(0.1, deadline - time.monotonic()) + 1.0)
        left = len(self._inbox)
        self.count_dropped(left)
        for box in self._outboxes:
            box.dropped += len(box.pending)
            left += len(box.pending)
        if left:
            log.warning("moe monitor: %d steps were not published before close (%s)", left, self.last_error)
        if self._thread.is_alive():  # stuck in a write (a Redis that never answers): leave its sinks to it
            log.warning("moe monitor: the publisher is still inside a sink's write; its sinks stay open")
            return False
        for box in self._outboxes:
            try:
                box.sink.close()
            except Exception as exc:  # one sink that fails to close must not keep the others open
                log.warning("moe monitor: closing the %s sink failed: %s", box.sink.name, exc)
        return left == 0

    # ------------------------------------------------------------------ the thread
    def _errors(self, skip: _Outbox | None) -> str:
        errors = [box.error for box in self._outboxes if box is not skip and box.error]
        return "; ".join(errors + [self._error] if self._error else errors)

    def _drain_inbox(self) -> None:
        while self._inbox:
            job = self._inbox.popleft()
            try:
                record = self._decode(job)
            except Exception as exc:  # a bug here must not kill the thread
                self._error = f"decode failed: {exc}"
                self.count_dropped()
                continue
            finally:
                self._release(job.slot)
            for box in self._outboxes:
                box.pending.append(record)
                while len(box.pending) > self._queue_steps:
                    box.pending.popleft()
                    box.dropped += 1

    def _wait_s(self) -> float:
        """How long the thread sleeps: flush_interval_s, or while every sink is backing off, until the
        first of them is due."""
        if not self._outboxes or any(box.backoff_s == 0.0 for box in self._outboxes):
            return self._flush_interval_s
        return max(0.0, min(box.retry_at for box in self._outboxes) - time.monotonic())

    def _run(self) -> None:
        backoff_s = 0.0  # after a failure outside the sinks (a bug): retry, never end publishing
        while True:
            self._wake.wait(timeout=backoff_s or self._wait_s())
            self._wake.clear()
            try:
                done = self._cycle()
                backoff_s = 0.0
            except Exception as exc:
                self._error = f"publisher error: {type(exc).__name__}: {exc}"
                log.exception("moe monitor publisher")
                done, backoff_s = self._stop, min(2.0, max(0.1, backoff_s * 2))
            if done:
                return

    def _cycle(self) -> bool:
        """One round: decode finished steps, then one batch to every sink that is due. Returns True when the
        thread should end (stopping, and every sink has either nothing left or just failed)."""
        self._drain_inbox()
        fresh = [self._samples.popleft() for _ in range(len(self._samples))]
        error = self._error
        now = time.monotonic()
        finished, landed = True, False
        for box in self._outboxes:
            box.samples.extend(fresh)
            if self._stop and not box.pending and not box.samples:
                continue
            if box.retry_at > now and not self._closing:
                finished = False
                continue
            if self._send(box):
                landed = True
                finished = finished and not box.pending
        if landed and self._error == error:
            self._error = ""  # reported in the health of the writes that just landed
        return self._stop and finished

    def _send(self, box: _Outbox) -> bool:
        """Write one batch to box's sink. True when it landed; False when the sink was idle or the write
        failed (then the batch stays queued and the sink backs off)."""
        with self._lock:  # stamped now, not at decode: drops of steps queued behind it count before it lands
            dropped = self._dropped + box.dropped
        records = [_with_dropped(box.pending[i], dropped) for i in range(min(self._batch, len(box.pending)))]
        samples = box.samples
        if not records and not samples and time.monotonic() - box.health_sent < 1.0:
            return False  # idle: health once a second, no round trip every tick
        health: dict[str, object] = {
            "rank": self._rank, "dropped_steps": dropped, "published_steps": box.published + len(records),
            "queued": len(box.pending) - len(records), "last_error": self._errors(box), "time_s": time.time()}
        try:
            box.sink.write(records, samples, health)
        except Exception as exc:  # this sink's failure; the others go on
            box.error = f"{box.sink.name} sink failed: {type(exc).__name__}: {exc}"
            box.samples = samples[-1000:]  # kept for the next try (the newest thousand)
            box.backoff_s = min(2.0, max(0.1, box.backoff_s * 2))
            box.retry_at = time.monotonic() + box.backoff_s
            return False
        box.health_sent = time.monotonic()
        box.samples = []
        for _ in records:
            box.pending.popleft()
        box.published += len(records)
        box.error, box.backoff_s, box.retry_at = "", 0.0, 0.0
        if len(box.pending) >= self._batch:
            self._wake.set()  # a backlog (after an outage): keep going without waiting
        return True


def _with_dropped(record: wire.StepRecord, dropped: int) -> wire.StepRecord:
    if record.dropped_steps == dropped:
        return record
    return dataclasses.replace(record, dropped_steps=dropped)

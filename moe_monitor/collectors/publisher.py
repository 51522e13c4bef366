"""The background publisher: the only threads that write to the sinks. The model's forward never waits on it.

Forward thread --submit(StepJob)--> inbox (bounded by the host slots) --> the publisher thread (no I/O): every
flush_interval_s it waits for a slot's copy, decodes it, frees the slot and queues the StepRecord for every
sink (the steps of the last queue_s seconds, at least QUEUE_MIN_STEPS of them, or exactly queue_steps when
given; never more than queue_bytes: the oldest dropped and counted). Each sink has a writer thread that hands it
batches of at most `batch` records with the NVML samples and health report, and backs off (0.1 s doubling to
2 s) while its writes fail. Layout changes (submit_layout), timings and physical counts (submit_physical) wait
in queues of their own per sink. Used by collectors.monitor; the guarantees: docs/wire.md.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import numpy as np

from moe_monitor import core
from moe_monitor.core.health import HealthReport

from .physical import PhysicalInbox, PhysicalJob
from .sinks import PartialWrite, Sink

if TYPE_CHECKING:  # annotations only: the publisher itself needs no torch (counter.py does)
    from .counter import HostSlot, StepFacts

log = logging.getLogger("moe_monitor.collectors")


# ------------------------------------------------------------------ what waits for one sink
T = TypeVar("T")


QUEUE_MIN_STEPS = 1024        # the seconds rule keeps at least this many records, whatever their age
RECORD_OVERHEAD_BYTES = 1024  # a queued record's Python objects besides its arrays (StepRecord: ~0.9 kB)


def record_bytes(record: object) -> int:
    """The memory a queued record holds: its arrays' bytes and RECORD_OVERHEAD_BYTES."""
    held = RECORD_OVERHEAD_BYTES
    for value in getattr(record, "__dict__", {}).values():
        if isinstance(value, np.ndarray):
            held += value.nbytes
    return held


@dataclass
class RecordQueue(Generic[T]):
    """One kind of record (steps, layout changes, timing records, physical counts) on its way to one sink:
    `waiting` (bounded: past the bounds the oldest are dropped and counted), `sending` (the batch being written
    now, held on top of the bounds), and the counts published and dropped. The publisher thread extends it, the
    sink's writer takes a batch and settles it with the indices that landed: those count as published, the
    others go back at the head (then the bounds apply again). Every method is called under the owning Outbox's
    lock. Bounds: `bound` records (None: none); with keep_s, records more than keep_s seconds older than the
    newest (their time_s) once more than `least` wait; and `max_bytes` of record_bytes() (None: none)."""

    bound: int | None
    max_bytes: int | None = None
    keep_s: float | None = None
    least: int = QUEUE_MIN_STEPS
    waiting: collections.deque[T] = field(default_factory=collections.deque)
    sending: list[T] = field(default_factory=list)
    published: int = 0
    dropped: int = 0
    held_bytes: int = 0   # record_bytes() of the waiting records (counted only under max_bytes)

    def __len__(self) -> int:
        """Records waiting or being written."""
        return len(self.waiting) + len(self.sending)

    def extend(self, records) -> None:
        """Queue records at the tail; the oldest beyond the bounds are dropped (counted)."""
        records = list(records)
        self.waiting.extend(records)
        if self.max_bytes is not None:
            self.held_bytes += sum(record_bytes(rec) for rec in records)
        self._bound()

    def take(self, most: int | None = None) -> list[T]:
        """Move at most `most` (None: all) of the oldest waiting records into `sending` and return them."""
        count = len(self.waiting) if most is None else min(most, len(self.waiting))
        self.sending = [self._pop() for _ in range(count)]
        return self.sending

    def settle(self, sent: list[T], landed) -> None:
        """The write of `sent` is over: the indices in `landed` are published; the rest go back at the head,
        before anything queued meanwhile (then the bounds apply)."""
        kept = [rec for i, rec in enumerate(sent) if i not in landed]
        self.published += len(sent) - len(kept)
        self.sending = []
        if kept:
            self.waiting.extendleft(reversed(kept))
            if self.max_bytes is not None:
                self.held_bytes += sum(record_bytes(rec) for rec in kept)
            self._bound()

    def drop_all(self) -> int:
        """Count everything still here as dropped (close); returns how many."""
        left = len(self)
        self.dropped += left
        self.waiting.clear()
        self.sending = []
        self.held_bytes = 0
        return left

    def _pop(self) -> T:
        record = self.waiting.popleft()
        if self.max_bytes is not None:
            self.held_bytes -= record_bytes(record)
        return record

    def _bound(self) -> None:
        waiting = self.waiting
        while waiting and ((self.bound is not None and len(waiting) > self.bound)
                           or (self.max_bytes is not None and self.held_bytes > self.max_bytes)
                           or (self.keep_s is not None and len(waiting) > self.least
                               and getattr(waiting[-1], "time_s", 0.0) - getattr(waiting[0], "time_s", 0.0)
                               > self.keep_s)):
            self._pop()
            self.dropped += 1


@dataclass
class Outbox:
    """One sink, what waits for it (steps, layouts, timings, physical counts, NVML samples) and its writer thread. The queues,
    samples and counters are changed under `lock` (the publisher thread appends, the writer takes and gives
    back)."""

    sink: Sink
    steps: RecordQueue
    layouts: RecordQueue
    timings: RecordQueue
    physical: RecordQueue = field(default_factory=lambda: RecordQueue(1024))  # physical-slot counts
    samples: list = field(default_factory=list)
    error: str = ""           # the last failed write's reason; cleared when a write lands
    failures: int = 0         # failed writes so far
    last_failure: str = ""    # the latest failed write's reason, kept after the sink recovers
    max_write_s: float = 0.0  # the longest write so far (a hung sink: bounded by its timeout)
    backoff_s: float = 0.0
    retry_at: float = 0.0     # time.monotonic() before which a failed sink is not tried again
    health_sent: float = 0.0  # time.monotonic() of the last write that landed
    errors_sent: str = ""     # the other sinks' standing errors that health reported: a change is sent at once
    finalised: bool = False   # close() has counted what is left: the writer changes nothing any more
    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.steps or self.layouts or self.timings or self.physical or self.samples)


def with_dropped(record: core.StepRecord, dropped: int) -> core.StepRecord:
    """record stamped with the steps dropped before it reached its sink (itself when already so)."""
    if record.dropped_steps == dropped:
        return record
    return dataclasses.replace(record, dropped_steps=dropped)


# ------------------------------------------------------------------ the publisher

MAX_SAMPLES = 1000  # NVML samples kept per sink while it cannot be written (the newest)
MAX_LAYOUTS = 256   # layout changes kept per sink while it cannot be written (~17 MB at 58 x 288 slots)


class StepJob(NamedTuple):
    """A step waiting for the publisher: its host slot and what the host knew of it at end_step (a tuple: made
    on the model's thread at every step's end)."""

    step: int
    time_s: float
    phase: str
    tokens: int | None      # set by the caller of end_step, else taken from facts / the device
    slot: HostSlot
    facts: StepFacts
    timings: Any = None     # collectors.timing.PendingTimings of the step, None when it timed nothing


class Publisher:
    """Owns the background threads. `decode(jobs) -> [StepRecord, ...]` (one a job, in order: the steps that
    finished since the last round, in one call) and `release(slot)` run on the publisher thread;
    `collector_health() -> dict` (optional) adds the collector's own figures to every health report (its
    "collector_error", when not empty, also joins last_error)."""

    def __init__(self, sinks: Sequence[Sink], decode: Callable[[list[StepJob]], list[core.StepRecord]],
                 release: Callable[[HostSlot], None], rank: int, queue_steps: int | None = 1024, batch: int = 256,
                 flush_interval_s: float = 0.1, wake_at: int | None = None,
                 collector_health: Callable[[], dict[str, object]] | None = None,
                 decode_timing: Callable[[StepJob], core.TimingRecord | None] | None = None,
                 queue_s: float = 60.0, queue_bytes: int | None = None):
        self._decode, self._release, self._rank = decode, release, rank
        self._batch, self._flush_interval_s = batch, flush_interval_s
        self._wake_at = wake_at or 0
        self._collector_health = collector_health
        self._decode_timing = decode_timing
        keep_s = None if queue_steps is not None else queue_s

        def queue(share: int) -> RecordQueue:  # the steps' queue gets queue_bytes, timings and physical a 4th each
            return RecordQueue(queue_steps, None if queue_bytes is None else max(1, queue_bytes // share), keep_s)

        self._outboxes = [Outbox(sink, queue(1), RecordQueue(MAX_LAYOUTS), queue(4), physical=queue(4))
                          for sink in sinks]
        self._physical = PhysicalInbox(queue_steps or QUEUE_MIN_STEPS)
        self._inbox: collections.deque[StepJob] = collections.deque()
        self._layout_inbox: collections.deque[core.LayoutRecord] = collections.deque()
        self._samples: collections.deque[core.GpuSample] = collections.deque(maxlen=MAX_SAMPLES)
        self._dropped = 0       # steps no sink got: no free host slot, a failed decode, left in the inbox
        self._error = ""        # the last failure outside the sinks; cleared once a write carrying it lands
        self._closing = False   # close() has begun: every sink is tried at once, backoff or not
        self._closing_at = float("inf")  # when it began: every working sink sends its health once after it
        self._stop = False      # the publisher thread drains once more and ends
        self._stop_writers = False
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="moe-monitor-publisher", daemon=True)
        writers = [threading.Thread(target=self._run_writer, args=(box,), daemon=True,
                                    name=f"moe-monitor-{box.sink.name}-writer") for box in self._outboxes]
        self._thread.start()
        for box, writer in zip(self._outboxes, writers):
            box.thread = writer
            writer.start()

    # ------------------------------------------------------------------ called from other threads
    def submit(self, job: StepJob) -> None:
        """Hand over a finished step. Wakes the thread only when the inbox reaches wake_at steps (it
        publishes in batches every flush_interval_s, so the model's thread is not preempted for the GIL
        after every step, yet a fast model never runs out of host slots)."""
        inbox = self._inbox
        inbox.append(job)
        if len(inbox) == self._wake_at:
            self._wake.set()

    def submit_sample(self, sample: core.GpuSample) -> None:
        self._samples.append(sample)

    def submit_layout(self, record: core.LayoutRecord) -> None:
        """Hand over a layout change (already validated); queued for every sink at the next drain, which it
        wakes at once. Never blocks, never does I/O."""
        self._layout_inbox.append(record)
        self._wake.set()

    def submit_physical(self, job: PhysicalJob) -> None:
        """Hand over one step's physical counts; read at the next drain. Never blocks, never does I/O: with
        queue_steps of them waiting (a publisher that stopped draining), this one is dropped and counted."""
        self._physical.submit(job)

    def count_dropped(self, n: int = 1) -> None:
        with self._lock:
            self._dropped += n

    @property
    def dropped_steps(self) -> int:
        """Steps missing from the sink that lacks the most."""
        return self._dropped + max((box.steps.dropped for box in self._outboxes), default=0)

    @property
    def published_steps(self) -> int:
        """Steps every sink has."""
        return min((box.steps.published for box in self._outboxes), default=0)

    @property
    def queued_steps(self) -> int:
        """Steps decoded and waiting for (or being written to) the sink with the longest queue."""
        return max((len(box.steps) for box in self._outboxes), default=0)

    @property
    def last_error(self) -> str:
        """Every failure that still stands ("" when none): each failing sink's, the publisher's own, the
        collector's."""
        return self._errors(None)

    def sink_stats(self) -> dict[str, dict[str, int | float | str]]:
        """Per sink (by name): published_steps, queued_steps, dropped_steps, last_error (standing), failures
        (failed writes so far), last_failure (the latest reason, kept after recovery), max_write_s, and
        published_layouts, queued_layouts, dropped_layouts (layout changes)."""
        stats: dict[str, dict[str, int | float | str]] = {}
        for box in self._outboxes:
            one: dict[str, int | float | str] = {
                "last_error": box.error, "failures": box.failures, "last_failure": box.last_failure,
                "max_write_s": round(box.max_write_s, 3)}
            for kind, queue in (("steps", box.steps), ("layouts", box.layouts), ("timings", box.timings),
                                ("physical", box.physical)):
                one.update({f"published_{kind}": queue.published, f"queued_{kind}": len(queue),
                            f"dropped_{kind}": queue.dropped})
            one["dropped_physical"] = int(one["dropped_physical"]) + self._physical.dropped
            one["dropped_steps"] = self._dropped + box.steps.dropped
            stats[box.sink.name] = one
        return stats

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and all(box.thread is not None and box.thread.is_alive()
                                               for box in self._outboxes)

    def close(self, timeout_s: float = 5.0) -> bool:
        """Publish what is queued (giving up after timeout_s), stop the threads, close every sink whose
        writer is not stuck in a write. True if nothing was left."""
        deadline = time.monotonic() + timeout_s
        self._closing_at = time.monotonic()
        self._closing = True
        while time.monotonic() < deadline and (self._inbox or self._samples or self._layout_inbox or
                                               self._physical or any(
                box.has_work or (not box.error and box.health_sent < self._closing_at) for box in self._outboxes)):
            self._wake.set()
            for box in self._outboxes:
                box.wake.set()
            time.sleep(0.01)
        self._stop = True
        self._wake.set()
        self._thread.join(max(0.1, deadline - time.monotonic()) + 1.0)  # it does no I/O: quick
        self._stop_writers = True
        for box in self._outboxes:
            box.wake.set()
        for box in self._outboxes:
            if box.thread is not None:
                box.thread.join(max(0.0, deadline - time.monotonic()) + 0.2)
        left = len(self._inbox)
        self.count_dropped(left)
        layouts_left = 0
        for box in self._outboxes:
            with box.lock:
                box.finalised = True
                left += box.steps.drop_all()
                box.layouts.dropped += len(self._layout_inbox)
                layouts_left += box.layouts.drop_all() + len(self._layout_inbox)
                box.timings.drop_all()
                box.physical.drop_all()
        if left:
            log.warning("moe monitor: %d steps were not published before close (%s)", left, self.last_error)
        if layouts_left:
            log.warning("moe monitor: %d layout changes were not published before close (%s)", layouts_left,
                        self.last_error)
        stuck = False
        for box in self._outboxes:
            if box.thread is not None and box.thread.is_alive():  # inside a write (a Redis that never answers)
                log.warning("moe monitor: the %s writer is still inside a write; that sink stays open", box.sink.name)
                stuck = True
                continue
            try:
                box.sink.close()
            except Exception as exc:  # one sink that fails to close must not keep the others open
                log.warning("moe monitor: closing the %s sink failed: %s", box.sink.name, exc)
        return left == 0 and not stuck

    # ------------------------------------------------------------------ the publisher thread (no I/O)
    def _errors(self, skip: Outbox | None, collector: dict[str, object] | None = None) -> str:
        errors = [box.error for box in self._outboxes if box is not skip and box.error]
        if self._error:
            errors.append(self._error)
        collector = self._collector() if collector is None else collector
        if collector.get("collector_error"):
            errors.append(str(collector["collector_error"]))
        return "; ".join(errors)

    def _collector(self) -> dict[str, object]:
        if self._collector_health is None:
            return {}
        try:
            return self._collector_health()
        except Exception as exc:  # a bug there must not stop publishing
            return {"collector_error": f"collector health failed: {type(exc).__name__}: {exc}"}

    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=self._flush_interval_s)
            self._wake.clear()
            stopping = self._stop  # read before the drain: the last round takes everything submitted
            try:
                self._drain()
            except Exception as exc:  # a bug here must not end publishing
                self._error = f"publisher error: {type(exc).__name__}: {exc}"
                log.exception("moe monitor publisher")
            if stopping:
                return

    def _drain(self) -> None:
        """Decode every finished step, give its slot back and queue it for every sink; hand out the NVML
        samples; wake the writers that got something."""
        jobs = [self._inbox.popleft() for _ in range(len(self._inbox))]  # only this thread takes from it
        try:
            records = self._decode_all(jobs)
        finally:
            for job in jobs:
                self._release(job.slot)
        timings: list[core.TimingRecord] = []
        for job in jobs:
            if job.timings is not None and self._decode_timing is not None:
                try:
                    timing = self._decode_timing(job)
                    if timing is not None:
                        timings.append(timing)
                except Exception as exc:  # a bug here must not kill the thread
                    self._error = f"timing decode failed: {type(exc).__name__}: {exc}"
        fresh = [self._samples.popleft() for _ in range(len(self._samples))]
        layouts = [self._layout_inbox.popleft() for _ in range(len(self._layout_inbox))]
        physical, refused = self._physical.drain()
        self._error = refused or self._error
        if not records and not fresh and not layouts and not timings and not physical:
            return
        for box in self._outboxes:
            with box.lock:
                if box.finalised:
                    continue
                box.steps.extend(records)
                box.layouts.extend(layouts)
                box.timings.extend(timings)
                box.physical.extend(physical)
                if fresh:
                    box.samples.extend(fresh)
                    del box.samples[:-MAX_SAMPLES]
            box.wake.set()

    def _decode_all(self, jobs: list[StepJob]) -> list[core.StepRecord]:
        """The jobs' records in one call to decode; when that raises, each job alone, so that a step that cannot
        be decoded is dropped (and counted) without the others."""
        if not jobs:
            return []
        try:
            records = self._decode(jobs)
        except Exception:  # a bug in one step's decode: found below
            records = []
        if len(records) == len(jobs):
            return records
        records = []
        for job in jobs:
            try:
                records.extend(self._decode([job]))
            except Exception as exc:  # a bug here must not kill the thread
                self._error = f"decode failed: {type(exc).__name__}: {exc}"
                self.count_dropped()
        return records

    # ------------------------------------------------------------------ one writer thread per sink
    def _run_writer(self, box: Outbox) -> None:
        while not self._stop_writers:
            now = time.monotonic()
            backing_off = box.retry_at > now and not self._closing
            box.wake.wait(timeout=max(0.0, box.retry_at - now) if backing_off else self._flush_interval_s)
            box.wake.clear()
            if self._stop_writers:
                return
            if box.retry_at > time.monotonic() and not self._closing:
                continue
            try:
                landed = self._send(box)
            except Exception as exc:  # a bug here must not end this sink's writes
                box.error = f"{box.sink.name} writer error: {type(exc).__name__}: {exc}"
                log.exception("moe monitor %s writer", box.sink.name)
                landed = False
            if landed is False and self._closing:
                time.sleep(0.01)  # retrying at once while closing: not in a hot loop

    def _send(self, box: Outbox) -> bool | None:
        """Write one batch to box's sink. True when it landed, False when it failed (in whole or in part:
        what did not land is queued again at the head and the sink backs off), None when there was nothing
        to write (health goes once a second when idle)."""
        with self._lock:
            dropped_before = self._dropped
        collector = self._collector()
        others = self._errors(box, collector)
        with box.lock:
            if box.finalised:
                return None
            now = time.monotonic()
            health_due = (box.health_sent < self._closing_at if self._closing else now - box.health_sent >= 1.0)
            if not box.has_work and others == box.errors_sent and not health_due:
                return None  # idle: health once a second (at once when what it says changed, once at close)
            dropped = dropped_before + box.steps.dropped  # stamped now: drops of steps queued behind these count
            sending = box.steps.take(self._batch)
            sending_layouts = box.layouts.take()   # every waiting layout, before the batch's steps
            sending_timings = box.timings.take(self._batch)
            sending_physical = box.physical.take(self._batch)
            samples, box.samples = box.samples, []
            queued = len(box.steps.waiting)
            published_steps, published_layouts = box.steps.published, box.layouts.published
            dropped_layouts = box.layouts.dropped
        records = [with_dropped(rec, dropped) for rec in sending]
        error_reported = self._error
        health = HealthReport(
            rank=self._rank, dropped_steps=dropped, published_steps=published_steps + len(records), queued=queued,
            last_error=others, sink_failures=box.failures, last_failure=box.last_failure, time_s=time.time(),
            extra={"published_layouts": published_layouts + len(sending_layouts), "dropped_layouts": dropped_layouts,
                   **{k: v for k, v in collector.items() if k != "collector_error"}})
        failure: Exception | None = None
        landed: frozenset[int] | range = range(len(records))
        layouts_landed: frozenset[int] | range = range(len(sending_layouts))
        timings_landed: frozenset[int] | range = range(len(sending_timings))
        physical_landed: frozenset[int] | range = range(len(sending_physical))
        samples_landed = True
        started = time.monotonic()
        try:
            # timings= and physical= only when there are some: a sink of a run without them never sees the argument
            extra = {name: sent for name, sent in (("timings", sending_timings), ("physical", sending_physical))
                     if sent}
            box.sink.write(records, samples, health, layouts=sending_layouts, **extra)
        except PartialWrite as exc:
            failure, landed, samples_landed = exc, exc.landed, exc.samples_landed
            layouts_landed, timings_landed = exc.layouts_landed, exc.timings_landed
            physical_landed = exc.physical_landed
        except Exception as exc:  # this sink's failure; the others go on
            failure, landed, samples_landed, layouts_landed = exc, frozenset(), False, frozenset()
            timings_landed = physical_landed = frozenset()
        finished = time.monotonic()
        with box.lock:
            box.max_write_s = max(box.max_write_s, finished - started)
            if box.finalised:  # close() gave up on this write and counted its batch: change nothing
                return failure is None
            # what did not land goes back at the head of its own queue (layouts are never bounded by the steps')
            box.steps.settle(sending, landed)
            box.layouts.settle(sending_layouts, layouts_landed)
            box.timings.settle(sending_timings, timings_landed)
            box.physical.settle(sending_physical, physical_landed)
            if not samples_landed:
                box.samples = (list(samples) + box.samples)[-MAX_SAMPLES:]
            backlog = max(len(box.steps.waiting), len(box.timings.waiting), len(box.physical.waiting)) >= self._batch
        if failure is not None:
            box.error = f"{box.sink.name} sink failed: {type(failure).__name__}: {failure}"
            if isinstance(failure, PartialWrite):
                box.error = f"{box.sink.name} sink refused {failure}"
            box.failures += 1
            box.last_failure = box.error
            box.backoff_s = min(2.0, max(0.1, box.backoff_s * 2))
            box.retry_at = finished + box.backoff_s
            return False
        box.health_sent, box.errors_sent = finished, others
        box.error, box.backoff_s, box.retry_at = "", 0.0, 0.0
        if error_reported and self._error == error_reported and getattr(box.sink, "keeps_health", True):
            self._error = ""  # reported in the health of the write that just landed (a sink that keeps it)
        if backlog:
            box.wake.set()  # a backlog (after an outage): keep going without waiting
        return True

"""What waits for one sink: its bounded record queues, its NVML samples and its writer's state.

A RecordQueue is one kind of record (steps, layout changes, timing records, physical counts) on its way to one sink: `waiting`
(bounded: past `bound` the oldest are dropped and counted), `sending` (the batch being written now, held on
top of the bound), and the counts published and dropped. The publisher thread extends it, the sink's writer
takes a batch and settles it with the indices that landed: those count as published, the others go back at
the head (then the bound applies again). Every method is called under the owning Outbox's lock.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from moe_monitor import core

from .sinks import Sink

T = TypeVar("T")


@dataclass
class RecordQueue(Generic[T]):
    bound: int
    waiting: collections.deque[T] = field(default_factory=collections.deque)
    sending: list[T] = field(default_factory=list)
    published: int = 0
    dropped: int = 0

    def __len__(self) -> int:
        """Records waiting or being written."""
        return len(self.waiting) + len(self.sending)

    def extend(self, records) -> None:
        """Queue records at the tail; the oldest beyond the bound are dropped (counted)."""
        self.waiting.extend(records)
        self._bound()

    def take(self, most: int | None = None) -> list[T]:
        """Move at most `most` (None: all) of the oldest waiting records into `sending` and return them."""
        count = len(self.waiting) if most is None else min(most, len(self.waiting))
        self.sending = [self.waiting.popleft() for _ in range(count)]
        return self.sending

    def settle(self, sent: list[T], landed) -> None:
        """The write of `sent` is over: the indices in `landed` are published; the rest go back at the head,
        before anything queued meanwhile (then the bound applies)."""
        kept = [rec for i, rec in enumerate(sent) if i not in landed]
        self.published += len(sent) - len(kept)
        self.sending = []
        if kept:
            self.waiting.extendleft(reversed(kept))
            self._bound()

    def drop_all(self) -> int:
        """Count everything still here as dropped (close); returns how many."""
        left = len(self)
        self.dropped += left
        self.waiting.clear()
        self.sending = []
        return left

    def _bound(self) -> None:
        while len(self.waiting) > self.bound:
            self.waiting.popleft()
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

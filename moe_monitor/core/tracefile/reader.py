"""TraceReader: what a reader of every trace container offers (the timeline, a range of steps, the NVML samples,
the layer timings, info); columnar.py and jsonl.py implement it, tracefile.open_trace opens one.

Shape legend: T steps, L layers, E experts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from moe_monitor import core

from .side import TimingRead
from .timeline import Timeline

MAX_READ_BYTES = 4 << 30  # bytes one read_steps call may decode, records included (a 4 GiB view is a mistake, not a page)


def out_of_memory(path: str, first_step: int, last_step: int) -> ValueError:
    """The one-line refusal of a read that ran out of memory (a MemoryError, e.g. under an address-space
    limit), raised in its place; the MemoryError stays its context."""
    return ValueError(f"{path}: steps {first_step}..{last_step} need more memory than this process may take "
                      "(read a shorter range, or open the trace where more memory is free)")


@dataclass(frozen=True)
class TraceInfo:
    """What `moe-monitor info` prints."""

    path: str
    container: str
    steps: int
    ranks: int
    first_step: int | None
    last_step: int | None
    span_s: float
    layouts: int
    gpu_samples: int
    size_bytes: int
    bad_records: int
    truncated: bool
    timings: int = 0


class TraceReader:
    """A trace opened for reading. meta: the run metadata; layouts: core.LayoutRecord in step order (checked
    against the run); bad_records / last_error: rows or lines skipped so far; truncated: the file ends inside
    a record (a recording cut short): what came before it reads."""

    container = ""

    def __init__(self, path: str):
        self.path = path
        self.meta: core.RunMeta
        self.layouts: list[core.LayoutRecord] = []
        self.bad_records = 0
        self.last_error = ""
        self.truncated = False

    def timeline(self) -> Timeline:
        """The steps of the trace (Timeline), from the per-row columns only."""
        raise NotImplementedError

    def read_steps(self, first_step: int, last_step: int) -> list[core.StepRecord]:
        """Every rank's record of the steps first_step..last_step (inclusive), in (step, rank) order; a
        record repeated in the file comes once; bad rows are skipped and counted in bad_records."""
        raise NotImplementedError

    def gpu_samples(self, t0_s: float = -np.inf, t1_s: float = np.inf) -> list[core.GpuSample]:
        """NVML samples with t0_s <= time_s <= t1_s, in time order."""
        raise NotImplementedError

    def read_timings(self, first_step: int, last_step: int) -> list[core.TimingRecord]:
        """The layer timings (core.TimingRecord: float32 [L] seconds per phase, NaN = not measured; L the run's
        layers) of every rank of the steps first_step..last_step (inclusive), in (step, rank) order, a record
        repeated in the file once; [] for a trace without timings. A bad row or line, or a timings table that
        is missing or does not read, is counted in bad_records (last_error says why), never raised: the steps
        read without it. ValueError only for a range holding more than side.MAX_TIMING_READ_BYTES."""
        return []

    def _timings_of(self, read: TimingRead) -> list[core.TimingRecord]:
        """read's records deduplicated in (step, rank) order; its bad rows or lines counted here."""
        if read.bad_records:
            self.bad_records += read.bad_records
            self.last_error = read.last_error
        return dedupe(read.records)

    def timing_rows(self) -> int:
        """How many timing records (rows of the timings table, timing lines) the trace holds, as indexed (a bad
        one is counted when it is read)."""
        return 0

    def layouts_in_force(self, first_step: int, last_step: int) -> list[core.LayoutRecord]:
        """The layout record in force at first_step (when any) and those taking force up to last_step."""
        before = [rec for rec in self.layouts if rec.step <= first_step]
        return before[-1:] + [rec for rec in self.layouts if first_step < rec.step <= last_step]

    def info(self) -> TraceInfo:
        tl = self.timeline()
        ranks = len({(rec.rank) for rec in self.read_steps(int(tl.step_T[0]), int(tl.step_T[0]))}) if tl.num_steps else 0
        samples, timings = len(self.gpu_samples()), self.timing_rows()  # before bad_records: they may add to it
        return TraceInfo(path=self.path, container=self.container, steps=tl.num_steps, ranks=ranks,
                         first_step=int(tl.step_T[0]) if tl.num_steps else None,
                         last_step=int(tl.step_T[-1]) if tl.num_steps else None, span_s=tl.span_s,
                         layouts=len(self.layouts), gpu_samples=samples, size_bytes=self.size_bytes(),
                         bad_records=self.bad_records, truncated=self.truncated, timings=timings)

    def size_bytes(self) -> int:
        return os.path.getsize(self.path)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RankRecord(Protocol):
    """A record of one rank's step (core.StepRecord, core.TimingRecord)."""

    @property
    def step(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def instance(self) -> str: ...


R = TypeVar("R", bound=RankRecord)


def dedupe(records: list[R]) -> list[R]:
    """Records in (step, rank, instance) order, a repeated (instance, rank, step) once (the first)."""
    seen: set[tuple[str, int, int]] = set()
    out = []
    for rec in sorted(records, key=lambda r: (r.step, r.rank, r.instance)):
        key = (rec.instance, rec.rank, rec.step)
        if key not in seen:
            seen.add(key)
            out.append(rec)
    return out

"""The one interface every data source implements; views never know which source they read.

A Source is polled on a timer (never blocking): each poll() returns only what arrived since the last one,
capped at max_entries. Malformed records are skipped and counted in the batch, never raised.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from moe_monitor import core

if TYPE_CHECKING:  # the traces package is imported by sources that implement Seekable
    from moe_monitor.core import tracefile
@dataclass
class Batch:
    """What one poll brought: new step records (one per step and rank), NVML samples, layout changes
    (core.LayoutRecord: decoded, not yet checked against the run's E: the reader does that), layer timings
    (core.TimingRecord, one per step and rank of an engine that times its MoE layers) and aggregated steps
    (core.AggregateRecord, one per step with its ranks summed by the aggregator, plus one per late entry),
    oldest first. A live source hands over either per-rank steps or aggregates for the run's steps (the
    aggregate when the aggregator runs), not both for the same step.

    bad_records: entries skipped because they did not decode; last_error: why the last one was skipped;
    more: the max_entries cap was hit, so more entries are waiting for the next poll; trimmed: the stream
    was trimmed past the last entry read before, so entries were lost unread."""

    steps: list[core.StepRecord] = field(default_factory=list)
    gpu_samples: list[core.GpuSample] = field(default_factory=list)
    layouts: list[core.LayoutRecord] = field(default_factory=list)
    timings: list[core.TimingRecord] = field(default_factory=list)
    aggregates: list[core.AggregateRecord] = field(default_factory=list)
    bad_records: int = 0
    last_error: str = ""
    more: bool = False
    trimmed: bool = False


@dataclass
class Health:
    """Where the data comes from and whether it is flowing.

    reachable: the source answered (Redis ping, trace file readable); where: redacted URL or file path;
    error: why it is not reachable; latency_ms: round trip of the last poll; last_seen_s: unix time the
    collector last wrote (None when unknown); collectors: rank -> the collector's own health report
    (dropped_steps, published_steps, queued, last_error, time_s and the collector's other figures); note: anything else worth a line ("replay finished");
    answered: not reachable, yet the server answered (a Redis error reply such as WRONGTYPE, MISCONF, OOM)."""

    reachable: bool
    where: str
    error: str = ""
    latency_ms: float | None = None
    last_seen_s: float | None = None
    collectors: dict[int, dict] = field(default_factory=dict)
    note: str = ""
    answered: bool = False


class Source(Protocol):
    """A run's records, read incrementally."""

    def poll(self, max_entries: int) -> Batch:
        """Records that arrived since the last poll (steps or aggregated steps, NVML samples, layout changes, layer
        timings), at most max_entries step (or aggregate) entries. Never blocks for new data; returns an empty Batch when there is none or the source is
        unreachable."""
        ...

    def meta(self) -> core.RunMeta | None:
        """The run's metadata (layer names, E, top-k, layout), or None when the collector has not written it."""
        ...

    def health(self) -> Health:
        """Reachability, latency and collector health as of the last poll."""
        ...


class Seekable(Protocol):
    """A source whose whole recording is at hand (a trace file): the dashboard can show its timeline and
    analyse any range of it, like a video. Live sources are not seekable (a live run is paused instead).

    isinstance() does not work on this protocol: test with `is_seekable(source)`."""

    def timeline(self) -> tracefile.Timeline:
        """One entry per step of the whole recording (ranks summed), oldest first: step ids, times, phases,
        tokens, per-step balancedness under the layout in force, and the steps layout changes start at."""
        ...

    def seek(self, first_step: int, last_step: int) -> Batch:
        """Every record of the steps first_step..last_step (inclusive, all ranks), plus the layout records in
        force over that range (the one in force at first_step first), oldest first. NVML samples of that
        time span and the layer timings of those steps ride along when the source has them. Raises ValueError when first_step > last_step."""
        ...


def is_seekable(source: object) -> bool:
    """Whether `source` implements Seekable (has callable timeline() and seek())."""
    return callable(getattr(source, "timeline", None)) and callable(getattr(source, "seek", None))

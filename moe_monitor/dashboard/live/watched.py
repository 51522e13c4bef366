"""A run being watched: one Source, the step window it fills, NVML history and reader-side counters.

The reader never sums ranks or judges restarts itself: per-rank records go through an in-process
core.assembly.Assembler (the aggregator's own, with the same deadline, epoch and duplicate rules), the aggregate
stream's records are already assembled, and the window takes assembled steps of one kind either way. A switch
between the two feeds skips the step ids the window already holds. No Streamlit here: the app keeps a WatchedRun
in st.session_state; the benchmarks, the exporter and the tests use it directly. Rules: docs/dashboard.md.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import operator
import time
from dataclasses import dataclass
from typing import Protocol

from moe_monitor import core
from moe_monitor.core.assembly import Assembler, Counters
from moe_monitor.core.restarts import RetiredInstances
from moe_monitor.dashboard.live.gpu_history import GpuHistory
from moe_monitor.dashboard.live.layout_changes import LayoutHistory, change_from_record
from moe_monitor.dashboard.live.record_checks import check_aggregate, check_counts, check_record
from moe_monitor.dashboard.live.samples import SampleRing
from moe_monitor.dashboard.live.timings import TimingRing
from moe_monitor.dashboard.live.window import DuplicateRecord, StepWindow
from moe_monitor.dashboard.sources.base import Batch, Source

RESTART_NOTE_S = 120.0  # how long "collector restarted at ..." stays on the page (wall seconds)
MAX_OLD_INSTANCES = 4096  # retired epochs remembered (their late records are skipped)
MAX_PENDING_LAYOUTS = 64  # layout changes waiting for their collector instance's first step (the oldest go)
MAX_GAP_HOLES = 256  # ranges of steps counted as missed that a step written at its deadline may still fill
DEADLINE_S = 2.0  # a step is assembled once all its ranks arrived or this long after its first (the aggregator's)
_INT32_MAX = 2**31 - 1
STEPS, AGGREGATE = "steps", "aggregate"  # feeds: per-rank records assembled here, or the aggregator's steps


@dataclass(frozen=True)
class RunNotes:
    """What the pages say about how a run was read: bad records and the latest error; a restart (restart_note,
    the late records of retired collectors skipped); restarted ranks held (held_note, held_records); holes
    (gap_note); the feed (steps or aggregate) with what was read and skipped; a rollup view's buckets read
    (None at full resolution) and why its stream could not be read."""

    bad_records: int = 0
    last_error: str = ""
    restart_note: str = ""
    skipped_old_records: int = 0
    held_note: str = ""
    held_records: int = 0
    gap_note: str = ""
    feed: str = ""
    steps_read: int = 0
    aggregates_read: int = 0
    late_outside: int = 0
    skipped_overlap: int = 0
    duplicate_records: int = 0
    rollups_read: int | None = None
    read_error: str = ""


class RunView(Protocol):
    """What every page reads of a run, live, rolled up, paused or replayed: its source (metadata, health), the
    window of steps (or rollup buckets), the layout changes, NVML history, sampled rows, layer timings, the
    world size, the steps the collectors dropped, and the notes. WatchedRun and RollupRun implement it."""

    @property
    def source(self) -> Source: ...
    @property
    def window(self) -> StepWindow | None: ...
    @property
    def world_size(self) -> int: ...
    @property
    def layouts(self) -> LayoutHistory: ...
    @property
    def gpus(self) -> GpuHistory: ...
    @property
    def samples(self) -> SampleRing: ...
    @property
    def timings(self) -> TimingRing: ...
    @property
    def dropped_steps(self) -> int: ...
    def tick(self) -> TickStats: ...
    def notes(self) -> RunNotes: ...


@dataclass
class TickStats:
    """What one tick did: entries taken (per-rank step records, aggregated steps, NVML samples), bad records
    skipped, wall time of poll + ingest in ms."""

    steps_in: int
    gpu_in: int
    bad: int
    more: bool
    ms: float
    aggregates_in: int = 0


class WatchedRun:
    """Polls a Source and keeps the last `window_steps` assembled steps and NVML samples.

    Counters: bad_records / last_error (entries that did not decode, records refused); steps_read (per-rank
    records taken); aggregates_read (aggregated entries taken); duplicate_records, skipped_old_records (records
    of retired collector instances or epochs), held_records / held_note (records of restarted ranks held while
    their step ids are behind), world_claims, missed_steps / gap_note, skipped_overlap (steps the window held
    already, after a switch of feed), late_outside (late entries whose step is not in the window), restarts."""

    def __init__(self, source: Source, window_steps: int, max_entries_per_tick: int = 2000,
                 deadline_s: float = DEADLINE_S):
        if window_steps < 1:
            raise ValueError(f"window_steps must be at least 1, got {window_steps}")
        self.source = source
        self.window_steps = window_steps
        self.max_entries_per_tick = max_entries_per_tick
        self.deadline_s = float(deadline_s)
        self.window: StepWindow | None = None
        self.gpus = GpuHistory()
        self.samples = SampleRing(window_steps)  # sampled routing rows for the What-if traffic model
        self.bad_records = 0
        self.last_error = ""
        self.steps_read = 0
        self.world_size = 1
        self.last_tick: TickStats | None = None
        self.assembler: Assembler | None = None  # sums the per-rank feed (None while the aggregate feeds)
        self._counted = Counters()  # the assembler's counters already folded into ours
        self._retired_seen = -1  # the assembler's version whose retired instances' layouts were forgotten
        self._entries = 0  # entry ids handed to the assembler (it needs one per record)
        self.retired = RetiredInstances(MAX_OLD_INSTANCES)  # epochs replaced (their records are skipped)
        self.held_note = ""
        self._held_given_up = 0
        self.world_claims = 0
        self.restarts = 0
        self.restarted_at_s: float | None = None  # collector time of the new epoch's first step
        self._restart_seen_s = float("-inf")  # reader wall time the restart was noticed
        self.skipped_old_records = 0
        self.duplicate_records = 0
        self.missed_steps = 0
        self.gap_note = ""
        self.layouts = LayoutHistory()
        self.timings = TimingRing(window_steps)
        self._pending_layouts: collections.deque[core.LayoutRecord] = collections.deque(maxlen=MAX_PENDING_LAYOUTS)
        self.feed = ""  # STEPS or AGGREGATE: the kind of step records read last ("" before any)
        self.feed_switches = 0
        self.aggregates_read = 0
        self.late_outside = 0
        self.skipped_overlap = 0
        self.epoch: str | None = None  # the epoch being shown (the assembler's: the instance that opened it)
        self._epoch_started_s = float("-inf")
        self._epoch_newest_s = float("-inf")
        self._last_on_time: tuple[int, int] | None = None  # (step, highest dropped count) of the last on-time step
        self._holes: collections.deque[list[int]] = collections.deque(maxlen=MAX_GAP_HOLES)  # [first, last, count]

    def tick(self) -> TickStats:
        """One non-blocking poll, assembled and folded into the window."""
        started = time.perf_counter()
        try:
            batch = self.source.poll(self.max_entries_per_tick)
        except Exception as exc:  # a Source must not raise; if one does, this tick is lost, not the page
            batch = Batch(bad_records=1, last_error=f"the source failed: {core.why(exc)}")
        self.bad_records += batch.bad_records
        if batch.last_error:
            self.last_error = batch.last_error
        trimmed = bool(getattr(batch, "trimmed", False))
        aggregates = list(getattr(batch, "aggregates", []))
        refused = 0
        if batch.steps:
            self._switch_feed(STEPS)
        if self.feed == STEPS:
            recorded = bool(getattr(self.source, "recorded", False)) and not batch.more
            assembled, accepted, refused = self._assemble(batch.steps, flush=recorded)
            refused += self._take_steps(assembled, trimmed)
            for rec in accepted:  # after the steps: a new epoch starts the sample ring afresh
                self.samples.add(rec)
        if aggregates:
            self._switch_feed(AGGREGATE)
            refused += self._take_steps(aggregates, trimmed)
        for sample in batch.gpu_samples:
            try:
                self.gpus.add(sample)
            except Exception as exc:
                refused += 1
                self.last_error = f"GPU sample of rank {_short(getattr(sample, 'rank', '?'))}: {core.why(exc)}"
        for timing in getattr(batch, "timings", ()):
            try:
                if self.is_retired(timing.instance):
                    self.skipped_old_records += 1
                    continue
                self.timings.add(timing)
            except Exception as exc:  # one bad record; the poll goes on
                refused += 1
                self.last_error = (f"timings of step {_short(getattr(timing, 'step', '?'))} rank "
                                   f"{_short(getattr(timing, 'rank', '?'))}: {core.why(exc)}")
        refused += self._take_layouts(getattr(batch, "layouts", []))
        self.bad_records += refused
        self.last_tick = TickStats(steps_in=len(batch.steps), gpu_in=len(batch.gpu_samples),
                                   bad=batch.bad_records + refused, more=batch.more,
                                   ms=(time.perf_counter() - started) * 1e3, aggregates_in=len(aggregates))
        return self.last_tick

    # ------------------------------------------------------------------------------ assembly
    def _assemble(self, records: list[core.StepRecord], flush: bool) -> tuple[list[core.AggregateRecord],
                                                                             list[core.StepRecord], int]:
        """Hand the per-rank records to the in-process assembler; returns (the steps it assembled, oldest step
        first; the records it took, for the sample ring; how many were refused as bad records). flush: write
        every pending step now (a recording: every rank of a step is at hand)."""
        assembler = self.assembler
        if assembler is None:
            assembler = self.assembler = Assembler("watched", deadline_s=self.deadline_s)
        meta = self.source.meta()
        assembler.meta_world = int(meta.world_size) if meta is not None else None
        entries: list[tuple[bytes, core.StepRecord]] = []
        refused = 0
        window = self.window
        shape = (window.num_layers, window.num_experts) if window is not None else None
        speaking = set(assembler.instance_of_rank.values())
        for rec in records:
            try:
                check_record(rec)  # before anything: a bad record must not open an epoch
                # the run's [L, E]: the window's, else the metadata's unless another job's collector wrote it
                fresh_meta = meta is not None and (not meta.instance or meta.instance == rec.instance
                                                   or meta.instance in speaking)
                want = shape or ((len(meta.layer_names), meta.num_experts) if meta is not None and fresh_meta
                                 else None)
                check_counts(rec.counts_LE, want, f"step {_short(rec.step)} rank {_short(rec.rank)}", _INT32_MAX,
                             "(int32, as on the wire)")
                SampleRing.check(rec)
            except Exception as exc:  # any failure of one record is one bad record; the poll goes on
                refused += 1
                self.last_error = f"step {_short(rec.step)} rank {_short(rec.rank)}: {core.why(exc)}"
                continue
            self._entries += 1
            entries.append((b"%d-0" % self._entries, rec))
        now_s = time.monotonic()
        try:
            out = assembler.add(entries, now_s)
            out.extend(assembler.due(math.inf if flush else now_s))
        except Exception as exc:  # never down: the poll's records are bad records, the next poll goes on
            self.last_error = f"assembling {len(entries)} records: {core.why(exc)}"
            return [], [], refused + len(entries)
        refused += self._fold_counters(assembler)
        acked = set(out.acks)
        accepted = [rec for entry_id, rec in entries if entry_id not in acked
                    and assembler.instance_of_rank.get(rec.rank) == rec.instance]
        self.steps_read += len(accepted)
        return [emitted.record for emitted in out.emitted], accepted, refused

    def _fold_counters(self, assembler: Assembler) -> int:
        """Take the assembler's new counts into the reader's counters; returns the new bad records."""
        now, before = assembler.counters, self._counted
        self.duplicate_records += now.duplicates - before.duplicates
        self.skipped_old_records += now.stale_records - before.stale_records
        self.world_claims += now.world_claims - before.world_claims
        self._held_given_up += now.held_records - before.held_records
        bad = (now.bad_records - before.bad_records) + (now.implausible_steps - before.implausible_steps) \
            + (now.too_old - before.too_old)
        if bad or now.world_claims != before.world_claims or now.instance_conflicts != before.instance_conflicts:
            self.last_error = assembler.last_problem or self.last_error  # a conflict of instances: said once
        self._counted = dataclasses.replace(now)
        held = assembler.held_ranks
        self.held_note = "" if not held else (
            f"rank{'s' if len(held) > 1 else ''} {', '.join(map(str, held[:8]))}{' ...' if len(held) > 8 else ''} "
            f"restarted: {'their' if len(held) > 1 else 'its'} step ids are behind the others' (records held until "
            f"they reach them)")
        if assembler.version != self._retired_seen:  # instances were retired: forget their layout changes
            self._retired_seen = assembler.version
            for change in list(self.layouts.changes):
                if change.instance and change.instance in assembler.retired:
                    self.layouts.forget(change.instance)
        return bad

    @property
    def held_records(self) -> int:
        """Records of restarted ranks held out while their step ids were behind (held now, or given up)."""
        return self._held_given_up + (self.assembler.held_count if self.assembler is not None else 0)

    @property
    def instance_of_rank(self) -> dict[int, str]:
        """rank -> the collector instance whose records count for it ({} while the aggregate feeds)."""
        return dict(self.assembler.instance_of_rank) if self.assembler is not None else {}

    def is_retired(self, instance: object) -> bool:
        """Whether records of this collector instance (or aggregator epoch) are no longer shown."""
        if not isinstance(instance, str):
            return False
        return instance in self.retired or (self.assembler is not None and instance in self.assembler.retired)

    # ------------------------------------------------------------------------------ assembled steps
    def _take_steps(self, records: list[core.AggregateRecord], trimmed: bool) -> int:
        """Fold assembled steps (the aggregator's or the in-process assembler's) into the window; returns how
        many were bad records."""
        bad = 0
        for rec in records:
            try:
                checked = check_aggregate(rec)  # before anything: a bad record must not restart the window
                if not self._current_epoch(rec):
                    self.skipped_old_records += 1
                    continue
                window = self._window_for(rec)
                if not rec.late and window.holds(int(rec.step)):  # the other feed filled it
                    self.skipped_overlap += 1
                    continue
                try:
                    if not window.add_aggregate(rec, checked):  # changes nothing when it raises
                        self.late_outside += 1
                        continue
                except DuplicateRecord:  # a rank the row holds already (a retried write, a switch of feed)
                    self.duplicate_records += 1
                    continue
                self.world_size = max(self.world_size, int(rec.world_size))
                self._epoch_newest_s = max(self._epoch_newest_s, float(rec.time_s))
                if not rec.late:
                    self._check_gap(rec, trimmed)
                if self.feed == AGGREGATE:
                    self.aggregates_read += 1
                    self.steps_read += int(rec.ranks_R.size)  # the per-rank records it stands for
            except Exception as exc:  # any failure of one record is one bad record; the poll goes on
                bad += 1
                self.last_error = f"step {_short(getattr(rec, 'step', '?'))}: {core.why(exc)}"
        return bad

    def _switch_feed(self, feed: str) -> None:
        """The source now hands over `feed` records: the new feed's epoch is adopted afresh, without a restart
        (the steps the window holds already are skipped: see _take_steps); per-rank records get a new assembler."""
        if self.feed == feed:
            return
        if self.feed:
            self.feed_switches += 1
        self.feed = feed
        self.epoch, self._epoch_started_s, self._last_on_time = None, float("-inf"), None
        self.assembler = None
        self._counted = Counters()
        self._retired_seen = -1

    def _current_epoch(self, rec: core.AggregateRecord) -> bool:
        """True when rec is of the epoch being shown (the first one seen is adopted); another epoch restarts the
        window: a newer one, or one the assembler went back to (it undid the epoch shown: core.restarts);
        False for a late entry of another epoch, and for an epoch retired or older than the one shown unless the
        assembler of this feed speaks for it again."""
        if rec.instance == self.epoch:
            return True
        if self.epoch is None:
            if rec.instance in self.retired:
                return False
            self.epoch, self._epoch_started_s = rec.instance, float(rec.time_s)
            return True
        if rec.late:
            return False
        back = self.feed == STEPS and self.assembler is not None and self.assembler.epoch == rec.instance
        if not back and (rec.instance in self.retired or rec.time_s < self._epoch_started_s):
            self.retired.add(rec.instance)  # an older epoch than the one shown
            return False
        self.retired.discard(rec.instance)
        self.retired.add(self.epoch)
        for change in self.layouts.changes:  # published by the collectors of the old epoch
            if change.time_s is not None and change.time_s <= self._epoch_newest_s:
                self.retired.add(change.instance)
                self.layouts.forget(change.instance)
        self.epoch, self._epoch_started_s = rec.instance, float(rec.time_s)
        self._epoch_newest_s = float(rec.time_s)
        self._last_on_time = None
        self._start_afresh(rec.time_s)
        return True

    def _check_gap(self, rec: core.AggregateRecord, trimmed: bool) -> None:
        """Steps absent between two on-time steps of one epoch, beyond what the collectors say they dropped (the
        highest dropped count among the step's ranks). A step written short at its deadline, after later complete
        ones, takes its count back from the hole counted before (at most MAX_GAP_HOLES holes are remembered)."""
        dropped = int(rec.dropped_R.max()) if rec.dropped_R.size else 0
        last = self._last_on_time
        if last is not None and rec.step <= last[0]:
            self._fill_hole(int(rec.step))
            return
        self._last_on_time = (int(rec.step), dropped)
        if last is None:
            return
        missed = rec.step - last[0] - 1 - max(0, dropped - last[1])
        if missed > 0:
            self.missed_steps += missed
            self._holes.append([last[0] + 1, int(rec.step) - 1, missed])
            why = "stream trimmed before the dashboard read them" if trimmed else "absent from the stream"
            self.gap_note = f"missed {self.missed_steps} steps ({why})"

    def _fill_hole(self, step: int) -> None:
        """A step older than the newest arrived (each step comes once on time): if it is in a hole counted as
        missed, it was late, not missed."""
        for hole in self._holes:
            first, last, count = hole
            if first <= step <= last and count > 0:
                hole[2] -= 1
                self.missed_steps -= 1
                if self.missed_steps <= 0:
                    self.missed_steps, self.gap_note = 0, ""
                elif self.gap_note:
                    self.gap_note = f"missed {self.missed_steps} steps{self.gap_note[self.gap_note.index(' ('):]}"
                return

    # ------------------------------------------------------------------------------ layout changes
    def _take_layouts(self, fresh: list[core.LayoutRecord]) -> int:
        """Fold the waiting and the newly polled layout changes into the history (after the poll's steps, so
        a new instance is known); returns how many were bad records."""
        bad = 0
        waiting = list(self._pending_layouts) + list(fresh)
        self._pending_layouts.clear()
        sizes = self._run_sizes()
        current = set(self.instance_of_rank.values())
        aggregated = self.feed == AGGREGATE  # an aggregate does not name the collectors: any not retired
        for rec in waiting:
            try:
                instance = rec.instance
                if self.is_retired(instance):
                    self.skipped_old_records += 1
                    continue
                if sizes is None or instance and instance not in current and not aggregated:
                    self._pending_layouts.append(rec)  # its sizes or its collector are not known yet
                    continue
                change = change_from_record(rec, *sizes)
                meta = self.source.meta()
                if meta is not None and change.gpus != meta.layout.gpus:
                    raise ValueError(f"it is for {change.gpus} GPUs, the run metadata says {meta.layout.gpus}")
                self.layouts.add(change)
            except Exception as exc:  # one bad record; the poll goes on
                bad += 1
                self.last_error = f"layout change from step {_short(getattr(rec, 'step', '?'))}: {core.why(exc)}"
        return bad

    def _run_sizes(self) -> tuple[int, int] | None:
        """(L, E) of the run: the window's, else the metadata's; None while neither is known."""
        if self.window is not None:
            return self.window.num_layers, self.window.num_experts
        meta = self.source.meta()
        return None if meta is None else (len(meta.layer_names), meta.num_experts)

    # ------------------------------------------------------------------------------ restarts
    def _start_afresh(self, time_s: float) -> None:
        """A new epoch (the collectors restarted as a whole) at collector time time_s: a fresh window."""
        self.window = None
        self.samples = SampleRing(self.window_steps)
        self.timings = TimingRing(self.window_steps)
        self.world_size = 1
        self.restarts += 1
        self.restarted_at_s = time_s
        self._restart_seen_s = time.time()

    @property
    def restart_note(self) -> str:
        """'collector restarted at <time>' for RESTART_NOTE_S after a restart was noticed, else ''."""
        if self.restarted_at_s is None or time.time() - self._restart_seen_s > RESTART_NOTE_S:
            return ""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.restarted_at_s))
        return f"collector restarted at {stamp} (window started afresh)"

    def _window_for(self, rec: core.AggregateRecord) -> StepWindow:
        if self.window is None:
            meta = self.source.meta()
            num_layers, num_experts = rec.counts_LE.shape
            # metadata written by a collector this epoch does not know (the previous job's) may be of another shape
            stale_meta = meta is not None and bool(meta.instance) and self.feed == STEPS \
                and meta.instance not in self.instance_of_rank.values()
            if meta is not None and not stale_meta and \
                    (len(meta.layer_names), meta.num_experts) != (num_layers, num_experts):
                raise ValueError(f"counts are [{num_layers}, {num_experts}] but the run metadata says "
                                 f"[{len(meta.layer_names)}, {meta.num_experts}]")
            self.window = StepWindow(self.window_steps, num_layers, num_experts)
        return self.window

    @property
    def dropped_steps(self) -> int:
        """Steps the collectors dropped (cumulative, summed over ranks) as of their latest records."""
        return sum(self.window.dropped_by_rank.values()) if self.window else 0

    def notes(self) -> RunNotes:
        """The reader's counters and messages as the pages show them."""
        return RunNotes(bad_records=self.bad_records, last_error=self.last_error, restart_note=self.restart_note,
                        skipped_old_records=self.skipped_old_records, held_note=self.held_note,
                        held_records=self.held_records, gap_note=self.gap_note, feed=self.feed,
                        steps_read=self.steps_read, aggregates_read=self.aggregates_read,
                        late_outside=self.late_outside, skipped_overlap=self.skipped_overlap,
                        duplicate_records=self.duplicate_records)


def _short(value) -> str:
    """A record's step or rank for a message (whatever its type, never a 5,000-digit number)."""
    try:
        number = operator.index(value)
    except TypeError:
        return repr(value)[:40]
    return str(number) if abs(number) < 10**20 else "a huge number"

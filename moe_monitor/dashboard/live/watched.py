"""A run being watched: one Source, the step window it fills, NVML history and reader-side counters.

No Streamlit here: the app keeps a WatchedRun in st.session_state, the benchmark and tests use it directly.

Collector restarts: the one rule of core.restarts (RankInstances.judge), shared with the aggregator. A rank
whose records come from a new instance retires its old instance only; while its step ids are behind the
others' its records are left out (counted in `held_records`, `held_note` says which rank and why), and they
count again once its step ids reach the others'. Most ranks restarting (a job restarted as a whole, its step
ids starting again) starts the window and the sample ring afresh, and `restarted_at_s` says when. Records of
retired instances that still arrive are skipped (counted in `skipped_old_records`, not as bad records). A
record claiming more ranks than the run metadata counts under the metadata's world (`world_claims`); one of a
rank beyond it, or with a step id far beyond its rank's newest, is one bad record.

Layout changes (core.LayoutRecord: an engine's rebalance) are kept in `layouts` (a LayoutHistory, bounded),
each checked against the run's [L, E] (and its GPU count, from the metadata) and otherwise one bad record.
They are taken after the poll's steps, and only from the collector instances being shown: a change of a
retired instance is skipped like its steps; one whose instance has sent no step yet (or that arrives before
the run's sizes are known) waits, at most MAX_PENDING_LAYOUTS of them, until its instance shows up.

Layer timings (core.TimingRecord, from an engine that times its MoE layers) go into `timings`, a TimingRing of
as many steps as the window; those of retired collector instances are skipped like their steps, a restart
empties it, and one that does not fit (another world size or layer count, a duplicate) is one bad record.

Aggregated steps (core.AggregateRecord: a step's ranks summed once by the aggregator, read by the source in
place of the per-rank records while the aggregator runs) fill the same window (StepWindow.add_aggregate: the
row is what the ranks' own records would have made). Their restart rule is the aggregator's epoch (its
`instance`, a new one when the collectors restarted and their step ids started again): a new epoch starts
the window afresh, records of retired epochs are skipped, and the layout changes issued before the old
epoch's newest step are forgotten (the collector instances that published them retired). Layout changes
are taken from any collector instance not retired (an aggregate does not name the collectors). A late entry
(ranks folded in after their step was written) adds into its step's row while that row is in the window,
else it is counted in `late_outside`. When the source switches between the two kinds (an aggregator started
or stopped), records of steps the window already holds from the other kind (at most the newest step at
the switch, and not newer than that step by more than FLOOR_SLACK_S) are skipped and counted in
`skipped_overlap`, except that an aggregated step holding every rank of a row the per-rank records left short,
and more, replaces that row (`completed_rows`): a switch neither doubles nor drops a step, nor leaves one short.
A (step, rank) that arrives twice (a collector's write retried after a timeout that had landed) is skipped and
counted in `duplicate_records`, not as a bad record.

Never down: a record that fails anywhere (decode, bounds, the window, the sample ring, whatever the
exception) is one bad record and the rest of the poll goes on; a Source that raises costs one tick, not the
page. What is kept per rank or per collector instance is bounded: ranks are below core.MAX_WORLD, and at
most MAX_OLD_INSTANCES retired instances are remembered (the oldest forgotten first).
"""
from __future__ import annotations

import collections
import operator
import time
from dataclasses import dataclass

from moe_monitor import core
from moe_monitor.core.restarts import Judgement, RankInstances, RetiredInstances, capped_world
from moe_monitor.dashboard.live.gpu_history import GpuHistory
from moe_monitor.dashboard.live.layout_changes import LayoutHistory, change_from_record
from moe_monitor.dashboard.live.record_checks import check_aggregate, check_record
from moe_monitor.dashboard.live.samples import SampleRing
from moe_monitor.dashboard.live.timings import TimingRing
from moe_monitor.dashboard.live.window import DuplicateRecord, StepWindow
from moe_monitor.dashboard.sources.base import Batch, Source

RESTART_NOTE_S = 120.0  # how long "collector restarted at ..." stays on the page (wall seconds)
MAX_OLD_INSTANCES = 4096  # retired collector instances remembered (their late records are skipped)
MAX_PENDING_LAYOUTS = 64  # layout changes waiting for their collector instance's first step (the oldest go)
MAX_GAP_HOLES = 256  # ranges of aggregated steps counted as missed that a late step may still fill
FLOOR_SLACK_S = 30.0  # after a switch of feed, a record newer than the window's newest step by more is not skipped
STEPS, AGGREGATE = "steps", "aggregate"  # feeds: per-rank records summed here, or steps summed by the aggregator


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
    """Polls a Source and keeps the last `window_steps` steps (ranks summed) and NVML samples.

    The window is created at the first step record (its [L, E] comes from the metadata when present, else
    from that record). bad_records counts entries that did not decode plus records the window refused
    (wrong shape, duplicates, too old); last_error says why the latest one was skipped. steps_read counts the
    per-rank step records taken (an aggregated step counts its ranks; aggregates_read counts the aggregated
    entries themselves); feed says which kind the source hands over now. missed_steps counts
    steps that never reached the dashboard (step ids that jump within one collector instance, beyond the
    collector's own dropped count), gap_note says why."""

    def __init__(self, source: Source, window_steps: int, max_entries_per_tick: int = 2000):
        if window_steps < 1:
            raise ValueError(f"window_steps must be at least 1, got {window_steps}")
        self.source = source
        self.window_steps = window_steps
        self.max_entries_per_tick = max_entries_per_tick
        self.window: StepWindow | None = None
        self.gpus = GpuHistory()
        self.samples = SampleRing(window_steps)  # sampled routing rows for the What-if traffic model
        self.bad_records = 0
        self.last_error = ""
        self.steps_read = 0
        self.world_size = 1
        self.last_tick: TickStats | None = None
        self.instances = RankInstances(MAX_OLD_INSTANCES)  # the restart rule's state (core.restarts)
        self.held_records = 0  # records of restarted ranks left out while their step ids were behind
        self.held_note = ""
        self.world_claims = 0  # records that claimed more ranks than the run metadata (counted under its world)
        self._instance_started_s = float("-inf")
        self.restarts = 0
        self.restarted_at_s: float | None = None  # collector time of the new instance's first record
        self._restart_seen_s = float("-inf")  # reader wall time the restart was noticed
        self.skipped_old_records = 0
        self._last_step_of: dict[tuple[str, int], tuple[int, int]] = {}  # (instance, rank) -> (step, dropped)
        self.missed_steps = 0
        self.gap_note = ""
        self.layouts = LayoutHistory()
        self.timings = TimingRing(window_steps)
        self._pending_layouts: collections.deque[core.LayoutRecord] = collections.deque(maxlen=MAX_PENDING_LAYOUTS)
        self.feed = ""  # STEPS or AGGREGATE: the kind of step records read last ("" before any)
        self.feed_switches = 0
        self.aggregates_read = 0
        self.late_outside = 0  # late aggregate entries whose step was not in the window (left it, or never read)
        self.skipped_overlap = 0  # records of steps the other feed had filled, skipped after a switch
        self.completed_rows = 0  # rows the per-rank feed left short that the aggregate's record replaced
        self.duplicate_records = 0  # (step, rank) records that arrived twice (a retried write), skipped
        self._floor: tuple[int, float] | None = None  # (newest step, its time) at the last switch of feed
        self.epoch: str | None = None  # the aggregator epoch being shown
        self._epoch_started_s = float("-inf")
        self._epoch_newest_s = float("-inf")
        self._last_aggregate: tuple[int, int] | None = None  # (step, highest dropped count) of the last on-time entry
        self._holes: collections.deque[list[int]] = collections.deque(maxlen=MAX_GAP_HOLES)  # [first, last, count]

    def tick(self) -> TickStats:
        """One non-blocking poll, folded into the window."""
        started = time.perf_counter()
        try:
            batch = self.source.poll(self.max_entries_per_tick)
        except Exception as exc:  # a Source must not raise; if one does, this tick is lost, not the page
            batch = Batch(bad_records=1, last_error=f"the source failed: {core.why(exc)}")
        self.bad_records += batch.bad_records
        if batch.last_error:
            self.last_error = batch.last_error
        refused = taken = 0
        trimmed = bool(getattr(batch, "trimmed", False))
        if batch.steps:
            self._switch_feed(STEPS)
        for rec in batch.steps:
            try:
                check_record(rec)  # before anything: a bad record must not restart the window
                rec = self._capped(rec)
                if not self._shown(self._current_instance(rec), rec.step, rec.time_s):
                    continue
                self.samples.check(rec)
                try:
                    self._window_for(rec).add(rec)  # changes nothing when it raises
                except DuplicateRecord:  # a collector's retried write that landed twice: skipped, not bad
                    self.duplicate_records += 1
                    continue
                self.samples.add(rec)
                self.world_size = max(self.world_size, int(rec.world_size))
                self._check_gap(rec, trimmed)
                taken += 1
            except Exception as exc:  # any failure of one record is one bad record; the poll goes on
                refused += 1
                self.last_error = f"step {_short(rec.step)} rank {_short(rec.rank)}: {core.why(exc)}"
        self.bad_records += refused
        self.steps_read += taken
        aggregates = getattr(batch, "aggregates", [])
        bad_aggregates = self._take_aggregates(aggregates, trimmed)
        refused += bad_aggregates
        self.bad_records += bad_aggregates
        for sample in batch.gpu_samples:
            try:
                self.gpus.add(sample)
            except Exception as exc:
                refused += 1
                self.bad_records += 1
                self.last_error = f"GPU sample of rank {_short(getattr(sample, 'rank', '?'))}: {core.why(exc)}"
        for timing in getattr(batch, "timings", ()):
            try:
                if timing.instance in self._old_instances:
                    self.skipped_old_records += 1
                    continue
                self.timings.add(timing)
            except Exception as exc:  # one bad record; the poll goes on
                refused += 1
                self.bad_records += 1
                self.last_error = (f"timings of step {_short(getattr(timing, 'step', '?'))} rank "
                                   f"{_short(getattr(timing, 'rank', '?'))}: {core.why(exc)}")
        bad_layouts = self._take_layouts(getattr(batch, "layouts", []))
        refused += bad_layouts
        self.bad_records += bad_layouts
        self.last_tick = TickStats(steps_in=len(batch.steps), gpu_in=len(batch.gpu_samples),
                                   bad=batch.bad_records + refused, more=batch.more,
                                   ms=(time.perf_counter() - started) * 1e3, aggregates_in=len(aggregates))
        return self.last_tick

    # ------------------------------------------------------------------------------ aggregated steps
    def _take_aggregates(self, aggregates: list[core.AggregateRecord], trimmed: bool) -> int:
        """Fold the poll's aggregated steps into the window; returns how many were bad records."""
        if aggregates:
            self._switch_feed(AGGREGATE)
        bad = 0
        for rec in aggregates:
            try:
                check_aggregate(rec)  # before anything: a bad record must not restart the window
                current = self._current_epoch(rec)
                if current and self.window is not None and self._overlaps(rec.step, rec.time_s) and \
                        self.window.complete_from_aggregate(rec):  # a row the per-rank feed left short
                    self.completed_rows += 1
                    self.aggregates_read += 1
                    continue
                if not self._shown(current, rec.step, rec.time_s):
                    continue
                if not self._window_for(rec).add_aggregate(rec):  # changes nothing when it raises
                    self.late_outside += 1
                    continue
                self.world_size = max(self.world_size, int(rec.world_size))
                self._epoch_newest_s = max(self._epoch_newest_s, float(rec.time_s))
                if not rec.late:
                    self._check_aggregate_gap(rec, trimmed)
                self.aggregates_read += 1
                self.steps_read += int(rec.ranks_R.size)  # the per-rank records it stands for
            except Exception as exc:  # any failure of one record is one bad record; the poll goes on
                bad += 1
                self.last_error = f"aggregated step {_short(getattr(rec, 'step', '?'))}: {core.why(exc)}"
        return bad

    def _switch_feed(self, feed: str) -> None:
        """The source now hands over `feed` records: remember the window's newest step (the other feed filled
        it; the new one's records up to there are skipped) and let the new feed's identity (collector
        instances per rank, or the aggregator's epoch) be adopted afresh, without a restart."""
        if self.feed == feed:
            return
        if self.feed:
            self.feed_switches += 1
            window = self.window
            newest = window.newest_step if window is not None else None
            if window is not None and newest is not None:
                self._floor = (newest, float(window.time_s_C[window.ordered_slots()].max()))
        self.feed = feed
        if feed == AGGREGATE:
            self.epoch, self._epoch_started_s, self._last_aggregate = None, float("-inf"), None
        else:
            self.instances.restore({}, self.instances.retired)
            self._instance_started_s, self._last_step_of = float("-inf"), {}

    def _shown(self, current: bool | None, step: int, time_s: float) -> bool:
        """Whether a record goes into the window: not (and counted) when it is not of the collector instance or
        aggregator epoch shown (current False: skipped_old_records; None: held out, counted already), or of a
        step the other feed filled (skipped_overlap)."""
        if current is None:
            return False
        if not current:
            self.skipped_old_records += 1
            return False
        if self._overlaps(step, time_s):
            self.skipped_overlap += 1
            return False
        return True

    def _overlaps(self, step: int, time_s: float) -> bool:
        """Whether a record is of a step the other feed filled before the last switch (see the module doc)."""
        floor = self._floor
        return floor is not None and int(step) <= floor[0] and float(time_s) <= floor[1] + FLOOR_SLACK_S

    def _current_epoch(self, rec: core.AggregateRecord) -> bool:
        """True when rec is of the aggregator epoch being shown (the first one seen is adopted); a newer epoch
        restarts the window; False for an epoch retired, or older than the one shown."""
        if rec.instance == self.epoch:
            return True
        if rec.instance in self._old_instances:
            return False
        if self.epoch is None:
            self.epoch, self._epoch_started_s = rec.instance, float(rec.time_s)
            return True
        if rec.time_s < self._epoch_started_s:  # an older epoch than the one shown
            self._retire(rec.instance)
            return False
        self._retire(self.epoch)
        for change in self.layouts.changes:  # published by the collectors of the old epoch
            if change.time_s is not None and change.time_s <= self._epoch_newest_s:
                self._retire(change.instance)
                self.layouts.forget(change.instance)
        self.epoch, self._epoch_started_s = rec.instance, float(rec.time_s)
        self._epoch_newest_s = float(rec.time_s)
        self._last_aggregate = None
        self._start_afresh(rec.time_s)
        return True

    def _check_aggregate_gap(self, rec: core.AggregateRecord, trimmed: bool) -> None:
        """Steps absent between two on-time aggregated steps of one epoch, beyond what the collectors say they
        dropped (the highest dropped count among the step's ranks). The aggregator writes a step short of ranks
        at its deadline, after later complete ones: such a step arriving into a hole counted before takes its
        count back (at most MAX_GAP_HOLES holes are remembered)."""
        dropped = int(rec.dropped_R.max()) if rec.dropped_R.size else 0
        last = self._last_aggregate
        if last is not None and rec.step <= last[0]:
            self._fill_hole(int(rec.step))
            return
        self._last_aggregate = (int(rec.step), dropped)
        if last is None:
            return
        missed = rec.step - last[0] - 1 - max(0, dropped - last[1])
        if missed > 0:
            self.missed_steps += missed
            self._holes.append([last[0] + 1, int(rec.step) - 1, missed])
            why = "stream trimmed before the dashboard read them" if trimmed else "absent from the stream"
            self.gap_note = f"missed {self.missed_steps} steps ({why})"

    def _fill_hole(self, step: int) -> None:
        """An aggregated step older than the newest arrived (each step comes once on time): if it is in a hole
        counted as missed, it was late, not missed."""
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
                if isinstance(instance, str) and instance in self._old_instances:
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

    @property
    def instance_of_rank(self) -> dict[int, str]:
        """rank -> the collector instance shown for it."""
        return self.instances.instance_of_rank

    @property
    def _old_instances(self) -> RetiredInstances:
        return self.instances.retired

    def _capped(self, rec: core.StepRecord) -> core.StepRecord:
        """rec under the run metadata's world size when it claims more (core.restarts.capped_world: counted in
        world_claims; a rank beyond that world raises, one bad record)."""
        meta = self.source.meta()
        rec, claim = capped_world(rec, int(meta.world_size) if meta is not None else None)
        if claim:
            self.world_claims += 1
            self.last_error = f"step {_short(rec.step)}: {claim}"
        return rec

    def _current_instance(self, rec: core.StepRecord) -> bool | None:
        """The restart rule (core.restarts) for one per-rank record: True when it goes into the window (most
        ranks restarting start a fresh window first); False for records of instances already replaced; None
        for a held-out record of a restarted rank (counted in held_records). A step id far beyond its rank's
        newest raises (one bad record)."""
        rule = self.instances
        before = rule.instance_of_rank.get(rec.rank)
        meta = self.source.meta()
        world = max(self.world_size, int(meta.world_size) if meta is not None else 1)
        said = rule.judge(rec.rank, rec.instance, rec.step, rec.time_s, world)
        if said is Judgement.CURRENT:
            return True
        if said is Judgement.STALE:
            return False
        if said is Judgement.IMPLAUSIBLE:
            raise ValueError(rule.why)
        if before is not None and before != rec.instance:  # this rank restarted: its old instance is retired
            self.layouts.forget(before)
            self._last_step_of = {k: v for k, v in self._last_step_of.items() if k[1] != rec.rank}
        if said is Judgement.FIRST:  # first record of this rank (or of this rank since a new epoch)
            first = self._instance_started_s == float("-inf")
            self._instance_started_s = rec.time_s if first else min(self._instance_started_s, rec.time_s)
            return True
        if said is Judgement.HELD:
            self.held_records += 1
            if before != rec.instance:
                self.held_note = rule.why
            return None
        if said is Judgement.REJOINED:
            self.held_note = "" if not rule.held else self.held_note
            return True
        for instance in rule.retired:  # NEW_EPOCH: most ranks restarted
            self.layouts.forget(instance)
        self.held_note = ""
        self._instance_started_s = rec.time_s
        self._last_step_of = {}
        self._start_afresh(rec.time_s)
        return True

    def _start_afresh(self, time_s: float) -> None:
        """A restart (collectors, or the aggregator's epoch) at collector time time_s: a fresh window."""
        self.window = None
        self.samples = SampleRing(self.window_steps)
        self.timings = TimingRing(self.window_steps)
        self.world_size = 1
        self._floor = None
        self.restarts += 1
        self.restarted_at_s = time_s
        self._restart_seen_s = time.time()

    def _retire(self, instance: str) -> None:
        self._old_instances.add(instance)

    @property
    def restart_note(self) -> str:
        """'collector restarted at <time>' for RESTART_NOTE_S after a restart was noticed, else ''."""
        if self.restarted_at_s is None or time.time() - self._restart_seen_s > RESTART_NOTE_S:
            return ""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.restarted_at_s))
        return f"collector restarted at {stamp} (window started afresh)"

    def _check_gap(self, rec: core.StepRecord, trimmed: bool) -> None:
        key = (rec.instance, rec.rank)
        last = self._last_step_of.get(key)
        self._last_step_of[key] = (rec.step, rec.dropped_steps)
        if last is None or rec.step <= last[0]:
            return
        missed = rec.step - last[0] - 1 - max(0, rec.dropped_steps - last[1])
        if missed > 0:
            self.missed_steps += missed
            why = "stream trimmed before the dashboard read them" if trimmed else "absent from the stream"
            self.gap_note = f"missed {self.missed_steps} steps ({why})"

    def _window_for(self, rec: core.StepRecord | core.AggregateRecord) -> StepWindow:
        if self.window is None:
            meta = self.source.meta()
            num_layers, num_experts = rec.counts_LE.shape
            # a per-rank record of another collector than the metadata's: the metadata may be the old one's
            stale_meta = isinstance(rec, core.StepRecord) and meta is not None and meta.instance and rec.instance \
                and meta.instance != rec.instance
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


def _short(value) -> str:
    """A record's step or rank for a message (whatever its type, never a 5,000-digit number)."""
    try:
        number = operator.index(value)
    except TypeError:
        return repr(value)[:40]
    return str(number) if abs(number) < 10**20 else "a huge number"

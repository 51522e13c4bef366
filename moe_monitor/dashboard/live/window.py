"""A ring of the last C assembled steps of one run (core.assembly made them), with cached GPU loads; WatchedRun
fills it and every page analyses its views.

Counts are int32, promoted to int64 the first time a step's sum would not fit (600 x 58 x 256: 35.6 MB, 71.3 MB
promoted). The ring reserves its bytes from core.membudget.current() and holds fewer steps when the budget cannot
(`budget_note`); GPU loads are cached per row (row version + layout key) and computed in chunks of CHUNK_BYTES,
and so are the reductions of each row's predicted GPU times under a cost model (row_times).
Details: docs/dashboard.md, "Inside the window".

Shape legend: C ring capacity (steps), T steps in a view, L layers, E logical experts, G GPUs.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core import membudget
from moe_monitor.core.costmodel import ReducedTimes, TimeModel, reduce_times
from moe_monitor.core.loadmodel import gpu_weights, slot_weights, weighted_loads
from moe_monitor.core.timeline import index_in_force
from moe_monitor.dashboard.analytics.balance import balancedness, busiest_per_layer
from moe_monitor.dashboard.live.layout_changes import LayoutChange
from moe_monitor.dashboard.live.record_checks import (
    PHASE_CODE,
    CheckedStep,
    bounded_int,
    check_aggregate,
    check_counts,
)

PHASE_FILTERS = {"both": tuple(range(len(core.PHASES))), "prefill": (PHASE_CODE["prefill"],),
                 "decode": (PHASE_CODE["decode"],), "train": (PHASE_CODE["train"],)}
_MIXED = PHASE_CODE["mixed"]
PENDING_GRACE_S = 5.0  # a step still missing ranks is left out of views until it is this old
MAX_CAPACITY = 65536  # steps a window may hold
MAX_WINDOW_BYTES = 2 << 30  # int32 counts of one ring at most (a wider ask is narrowed to this, whatever the budget)
CHUNK_BYTES = 16 << 20  # counts of the rows one step of a loads computation or a sum over rows copies at most
ROW_OVERHEAD_BYTES = 8 * 8 + 256  # per row: the C-long bookkeeping arrays and the row's set of ranks
_INT32_MAX = int(np.iinfo(np.int32).max)
MAX_MISSING_LISTED = 32  # ranks named by missing_ranks()
MAX_AGGREGATE_CELL = (1 << 47) - 1  # an aggregated count: int32 counts of at most core.MAX_WORLD ranks summed
TIME_TEMPORARIES = 10  # float64 [rows, L, P] arrays a chunk of row_times() holds at its peak (slot tokens, gpu_times)


@dataclass
class WindowView:
    """The steps of a window that pass a phase filter, oldest first.

    slots_T: ring rows; step_T, time_s_T, tokens_T, ranks_T, phase_T (str); loads_TLG float32 GPU loads,
    each step's under the layout in force at that step; counts_sum_LE int64 tokens per expert summed over
    these steps; steps_T int64 the steps each row holds (1 for a step; a rollup bucket's steps, see
    dashboard.live.buckets)."""

    slots_T: np.ndarray
    step_T: np.ndarray
    time_s_T: np.ndarray
    tokens_T: np.ndarray
    ranks_T: np.ndarray
    phase_T: np.ndarray
    loads_TLG: np.ndarray
    counts_sum_LE: np.ndarray
    steps_T: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        """Rows in the view (steps; rollup buckets in a bucket window)."""
        return int(self.slots_T.size)


@dataclass(frozen=True)
class RowStats:
    """What every tick derives from each row's GPU loads [L, G], kept per row with the loads: eta_TL float64
    balancedness per layer (NaN for an idle layer); max_TG float32 each GPU's load in its busiest layer;
    layer_sum_TG float64 each GPU's load summed over layers; busiest_TL int64 the GPU each layer waits for and
    busy_TL bool whether that layer has any load (dashboard.analytics.balance.busiest_per_layer)."""

    eta_TL: np.ndarray
    max_TG: np.ndarray
    layer_sum_TG: np.ndarray
    busiest_TL: np.ndarray
    busy_TL: np.ndarray


@dataclass
class _RowCache:
    eta_CL: np.ndarray
    max_CG: np.ndarray
    layer_sum_CG: np.ndarray
    busiest_CL: np.ndarray
    busy_CL: np.ndarray

    @classmethod
    def empty(cls, capacity: int, num_layers: int, gpus: int) -> _RowCache:
        return cls(np.full((capacity, num_layers), np.nan), np.zeros((capacity, gpus), dtype=np.float32),
                   np.zeros((capacity, gpus)), np.zeros((capacity, num_layers), dtype=np.int64),
                   np.zeros((capacity, num_layers), dtype=bool))

    def update(self, rows: np.ndarray, loads_TLG: np.ndarray) -> None:
        self.eta_CL[rows] = balancedness(loads_TLG)
        self.max_CG[rows] = loads_TLG.max(axis=1)
        self.layer_sum_CG[rows] = loads_TLG.sum(axis=1, dtype=np.float64)
        self.busiest_CL[rows], self.busy_CL[rows] = busiest_per_layer(loads_TLG)

    def of(self, rows: np.ndarray) -> RowStats:
        return RowStats(self.eta_CL[rows], self.max_CG[rows], self.layer_sum_CG[rows], self.busiest_CL[rows],
                        self.busy_CL[rows])


@dataclass
class _TimeCache:
    """ReducedTimes of every ring row [C, ...] under one TimeModel, with the row version and layout key of each."""

    model: TimeModel
    rows: ReducedTimes
    version_C: np.ndarray
    key_C: np.ndarray

    @classmethod
    def empty(cls, model: TimeModel, capacity: int, num_layers: int) -> _TimeCache:
        per_TL = {name: np.zeros((capacity, num_layers), dtype=np.int64 if name == "busiest_TL" else np.float64)
                  for name in ReducedTimes.FIELDS_TL}
        return cls(model, ReducedTimes(**per_TL, gpus=model.gpus), np.full(capacity, -1, dtype=np.int64),
                   np.zeros(capacity, dtype=np.int64))

    def fits(self, model: TimeModel) -> bool:
        old = self.model
        return (old.dims, old.profile, old.gpus, old.nodes) == (model.dims, model.profile, model.gpus, model.nodes)

    def update(self, rows: np.ndarray, got: ReducedTimes) -> None:
        for name in ReducedTimes.FIELDS_TL:
            getattr(self.rows, name)[rows] = getattr(got, name)

    def of(self, rows: np.ndarray) -> ReducedTimes:
        return ReducedTimes(**{name: getattr(self.rows, name)[rows] for name in ReducedTimes.FIELDS_TL},
                            gpus=self.rows.gpus)

    @staticmethod
    def row_bytes(num_layers: int) -> int:
        return num_layers * len(ReducedTimes.FIELDS_TL) * 8 + 16


@dataclass(frozen=True)
class MissingRanks:
    """Ranks absent from rows of a window whose step is complete by age (older than the grace period):
    rank_steps: (step, rank) pairs missing in all; steps: rows missing at least one rank; by_rank: (rank,
    steps it is missing from), the most missing first, at most MAX_MISSING_LISTED ranks."""

    rank_steps: int = 0
    steps: int = 0
    by_rank: tuple[tuple[int, int], ...] = ()


class DuplicateRecord(ValueError):
    """A (step, rank) the row already holds: a collector's retried write that landed twice, skipped and
    counted apart from bad records."""


class StepWindow:
    """The last `capacity` assembled steps of a run, a row a step (core.AggregateRecord: add_aggregate; a late
    entry's ranks add into their step's row); a step older than
    everything in a full ring, a duplicate (step, rank) or a record of another shape is refused with
    ValueError so the caller can count it as a bad record. resolution_s: 0, rows are single steps (a
    dashboard.live.buckets.BucketWindow holds rollup buckets instead)."""

    resolution_s = 0

    def __init__(self, capacity: int, num_layers: int, num_experts: int,
                 budget: membudget.MemoryBudget | None = None):
        """A ring of up to `capacity` steps of [num_layers, num_experts] counts, reserved from `budget` (default
        core.membudget.current()); fewer steps when the budget cannot hold them (see budget_note), ValueError
        when it cannot hold one."""
        if capacity < 1 or num_layers < 1 or num_experts < 1:
            raise ValueError(f"window needs capacity, layers and experts >= 1, got {capacity}, {num_layers}, {num_experts}")
        num_layers, num_experts, _ = core.check_sizes(num_layers, num_experts)
        capacity = asked = bounded_int(capacity, "window capacity", 1, MAX_CAPACITY + 1)
        cells = num_layers * num_experts
        self.budget_note = ""  # why the window holds fewer steps than asked ("" when it holds them all)
        if capacity * cells * 4 > MAX_WINDOW_BYTES:
            capacity = max(1, MAX_WINDOW_BYTES // (cells * 4))
            self.budget_note = (f"window narrowed to {capacity} of {asked} steps: one window holds at most "
                                f"{membudget.format_bytes(MAX_WINDOW_BYTES)} of counts")
        self.budget = membudget.current() if budget is None else budget
        fixed_bytes = self.fixed_bytes(num_layers, num_experts)
        step_bytes = self.step_bytes(num_layers, num_experts)
        granted = self.budget.reserve_rows(step_bytes, capacity, fixed_bytes)
        if granted is None:
            raise ValueError(f"a window of [{num_layers}, {num_experts}] counts needs "
                             f"{membudget.format_bytes(fixed_bytes + step_bytes)} for one step and "
                             f"{self.budget.describe()} has {membudget.format_bytes(self.budget.available_bytes)} "
                             f"left: it is shared by {self.budget.shared_by}")
        self._reservation, fits = granted  # given back when the window is dropped (core.membudget.Reservation)
        # counts and bookkeeping; the loads' come on top (reserved for G = E until their G is known)
        self._held_bytes = fixed_bytes + fits * self.row_bytes(num_layers, num_experts)
        if fits < capacity:
            capacity = fits
            self.budget_note = (f"window narrowed to {capacity} of {asked} steps: {self.budget.describe()} is "
                                f"shared by {self.budget.shared_by}")
        self.asked_capacity = asked
        self.capacity, self.num_layers, self.num_experts = capacity, num_layers, num_experts
        self.counts_CLE = np.zeros((capacity, num_layers, num_experts), dtype=np.int32)
        self.step_C = np.full(capacity, -1, dtype=np.int64)
        self.time_s_C = np.zeros(capacity, dtype=np.float64)
        self.tokens_C = np.zeros(capacity, dtype=np.int64)
        self.ranks_C = np.zeros(capacity, dtype=np.int32)
        self.world_C = np.ones(capacity, dtype=np.int32)
        self.phase_C = np.zeros(capacity, dtype=np.int8)
        self.row_version_C = np.zeros(capacity, dtype=np.int64)
        self.steps_C = np.ones(capacity, dtype=np.int64)  # steps a row holds (a rollup bucket's: BucketWindow)
        # per phase code (core.PHASES order): counts summed over the steps of that phase in the ring, [phases, L, E]
        self.sums_by_phase_LE = np.zeros((len(core.PHASES), num_layers, num_experts), dtype=np.int64)
        self._ranks_seen: list[set[int]] = [set() for _ in range(capacity)]
        self._slot_of_step: dict[int, int] = {}
        self.size = 0
        self.head = 0  # next slot to write
        self.dropped_by_rank: dict[int, int] = {}
        self._version = 0
        self._loads_gpus = 0  # G of the cached loads (0: none yet)
        self._loads_CLG = np.zeros((0, self.num_layers, 0), dtype=np.float32)  # sized at the first loads_CLG()
        self._rows = _RowCache.empty(0, self.num_layers, 0)  # per-row statistics of the cached loads
        self._loads_version_C = np.full(capacity, -1, dtype=np.int64)  # row version the cached loads are of
        self._loads_key_C = np.zeros(capacity, dtype=np.int64)  # key of the layout they were computed under
        self._weights_by_key: dict[int, np.ndarray] = {}  # layout key -> gpu_weights [L, E, G]
        self._weights_LEG = np.zeros((self.num_layers, self.num_experts, 0))  # the base layout's weights
        self._loads_bytes = 0  # held for the cached loads
        self._times: _TimeCache | None = None  # reductions of predicted GPU times (row_times)
        self._times_bytes = 0  # held for them

    # ------------------------------------------------------------------------------------------ writes
    def add_aggregate(self, rec: core.AggregateRecord, checked: CheckedStep | None = None) -> bool:
        """Sum an aggregated step (the ranks the aggregator summed) into the row of its step exactly as those
        ranks' own records would have been: ranks present, world size, tokens, each rank's dropped count. A new
        row for a new step; a late entry (rec.late: ranks that arrived after the step was written) adds into
        its step's row while that row is in the ring, and is not added (returns False: the caller counts it)
        once the row has left or was never read. Returns True when added. ValueError, with the window left as
        it was, for a record of another shape, a rank already in the row (a duplicate) or a step older than a
        full ring. checked: check_aggregate(rec) when the caller has it already."""
        got = check_aggregate(rec) if checked is None else checked
        counts = self.checked_counts(rec.counts_LE, f"aggregated step {got.step}", MAX_AGGREGATE_CELL,
                                     "(sums of int32 counts over at most 65,536 ranks)")
        if got.late and got.step not in self._slot_of_step:
            return False
        seen = set(got.ranks_R.tolist())
        slot = self._slot_for(got.step, counts, seen)
        # nothing below raises: every value was checked and converted above
        dropping = got.dropped_R > 0
        for rank, dropped in zip(got.ranks_R[dropping].tolist(), got.dropped_R[dropping].tolist()):
            self.dropped_by_rank[rank] = max(self.dropped_by_rank.get(rank, 0), dropped)
        self._write(slot, got.step, counts, seen, got.world, got.tokens, got.time_s, got.phase_code)
        return True

    def _slot_for(self, step: int, counts: np.ndarray, ranks: set[int]) -> int | None:
        """The row of `step` (None: a new row) once the ranks can go into it: ValueError when one of them is
        already there or the step is older than a full ring. Widens the ring to int64 when the sum (or a new
        row's counts) would not fit int32. Changes nothing else."""
        slot = self._slot_of_step.get(step)
        peak = int(counts.max()) if counts.size else 0
        if slot is not None:
            twice = ranks & self._ranks_seen[slot]
            if twice:
                raise DuplicateRecord(f"step {step} rank {min(twice)} arrived twice")
            peak += int(self.counts_CLE[slot].max())
        elif self.size == self.capacity and step < self.step_C[self.head]:
            raise ValueError(f"step {step} is older than the window (oldest kept: {self.step_C[self.head]})")
        self._fit(step, peak)
        return slot

    def _fit(self, step: int, peak: int) -> None:
        """Widen the ring to int64 when a row's counts would reach peak beyond int32 (ValueError when the budget
        cannot hold the wider ring; nothing changed then)."""
        if self.counts_CLE.dtype == np.int32 and peak > _INT32_MAX:
            extra = self.counts_CLE.nbytes  # int64 doubles the counts
            if not self._reservation.resize_to(self._reservation.nbytes + extra):
                raise ValueError(f"step {step}: its counts summed over ranks outgrow int32 and widening the window "
                                 f"to int64 needs {membudget.format_bytes(extra)} more than {self.budget.describe()} "
                                 f"has left")
            self._held_bytes += extra
            self.counts_CLE = self.counts_CLE.astype(np.int64)  # exact sums from now on (values unchanged)

    def _write(self, slot: int | None, step: int, counts: np.ndarray, ranks: set[int], world: int, tokens: int,
               time_s: float, code: int) -> int:
        """Sum checked values into `slot` (the step's row; None: a new row at the head, the oldest leaving a
        full ring). Returns the row. Never raises."""
        self._version += 1
        if slot is not None:
            self._ranks_seen[slot] |= ranks
            old = int(self.phase_C[slot])
            self.sums_by_phase_LE[old] -= self.counts_CLE[slot]
            self.counts_CLE[slot] += counts
            self.phase_C[slot] = old if old == code else _MIXED
            self.sums_by_phase_LE[self.phase_C[slot]] += self.counts_CLE[slot]
            self.time_s_C[slot] = max(self.time_s_C[slot], time_s)
            self.tokens_C[slot] += tokens
            self.ranks_C[slot] += len(ranks)
            self.row_version_C[slot] = self._version
            return slot
        slot = self.head
        if self.size == self.capacity:
            self.sums_by_phase_LE[self.phase_C[slot]] -= self.counts_CLE[slot]
            del self._slot_of_step[int(self.step_C[slot])]
        else:
            self.size += 1
        self.head = (self.head + 1) % self.capacity
        self.counts_CLE[slot] = counts
        self.sums_by_phase_LE[code] += counts
        self.step_C[slot], self.time_s_C[slot], self.tokens_C[slot] = step, time_s, tokens
        self.phase_C[slot], self.ranks_C[slot], self.world_C[slot] = code, len(ranks), world
        self._ranks_seen[slot] = set(ranks)
        self._slot_of_step[step] = slot
        self.row_version_C[slot] = self._version
        return slot

    def checked_counts(self, counts: object, what: str, highest: int, why: str) -> np.ndarray:
        """counts as an integer array [L, E] of this window with values in 0..highest; ValueError otherwise."""
        return check_counts(counts, (self.num_layers, self.num_experts), what, highest, why)

    # ------------------------------------------------------------------------------------------ memory
    @staticmethod
    def row_bytes(num_layers: int, num_experts: int) -> int:
        """Bytes one step's int32 counts [L, E] and bookkeeping take in a window."""
        return num_layers * num_experts * 4 + ROW_OVERHEAD_BYTES

    @staticmethod
    def loads_row_bytes(num_layers: int, gpus: int) -> int:
        """Bytes one step's cached GPU loads take: float32 [L, G] and the per-row statistics (_RowCache)."""
        return num_layers * gpus * 4 + num_layers * 17 + gpus * 12

    @classmethod
    def step_bytes(cls, num_layers: int, num_experts: int) -> int:
        """Bytes a window of [L, E] counts reserves per step when it is made: counts, bookkeeping and the loads
        of at most one GPU per expert (G = E; given back down to the real G when the loads are first asked)."""
        return cls.row_bytes(num_layers, num_experts) + cls.loads_row_bytes(num_layers, num_experts)

    @staticmethod
    def fixed_bytes(num_layers: int, num_experts: int) -> int:
        """Bytes a window of [L, E] counts reserves whatever its steps: the per-phase sums, int64 [phases, L, E]."""
        return len(core.PHASES) * num_layers * num_experts * 8

    @property
    def reserved_bytes(self) -> int:
        """Bytes this window holds of its budget now (0 after close())."""
        return 0 if self._reservation.released else self._reservation.nbytes

    def close(self) -> None:
        """Give the window's bytes back to its budget now (also done when the window is garbage-collected);
        the window must not be used afterwards."""
        self._reservation.release()

    def _reserve_loads(self, gpus: int) -> None:
        """Hold the bytes of cached GPU loads on `gpus` GPUs (float32 [C, L, G] and the per-row statistics)
        instead of those of the previous GPU count; ValueError, nothing changed, when the budget cannot."""
        L, C = self.num_layers, self.capacity
        loads_bytes = C * self.loads_row_bytes(L, gpus)
        if not self._reservation.resize_to(self._held_bytes + loads_bytes + self._times_bytes):
            raise ValueError(f"GPU loads of this window ({C} steps x {L} layers x {gpus} GPUs) need "
                             f"{membudget.format_bytes(loads_bytes)} and {self.budget.describe()} has "
                             f"{membudget.format_bytes(self.budget.available_bytes)} left: it is shared by "
                             f"{self.budget.shared_by}")
        self._loads_bytes = loads_bytes

    def _chunks(self, rows: np.ndarray) -> Iterator[np.ndarray]:
        """rows in consecutive pieces whose counts, or float64 copies of their loads, take at most CHUNK_BYTES
        (at least one row each)."""
        row_bytes = max(self.num_experts * self.counts_CLE.itemsize, self._loads_gpus * 8) * self.num_layers
        per = max(1, CHUNK_BYTES // row_bytes)
        for start in range(0, rows.size, per):
            yield rows[start:start + per]

    def sum_counts(self, slots: np.ndarray) -> np.ndarray:
        """int64 [L, E]: counts of the given ring rows summed, a chunk of rows at a time (no copy of them all)."""
        total_LE = np.zeros((self.num_layers, self.num_experts), dtype=np.int64)
        for chunk in self._chunks(np.asarray(slots, dtype=np.int64)):
            total_LE += self.counts_CLE[chunk].sum(axis=0, dtype=np.int64)
        return total_LE

    # ------------------------------------------------------------------------------------------ reads
    def ordered_slots(self) -> np.ndarray:
        """Ring rows oldest first: int64 [size]."""
        start = (self.head - self.size) % self.capacity
        return (start + np.arange(self.size)) % self.capacity

    def loads_CLG(self, physical_to_logical_map, gpus: int, schedule: Sequence[LayoutChange] = ()) -> np.ndarray:
        """float32 [C, L, G] GPU loads of every ring row. A row's layout is the change of schedule (ascending
        by step, every change on `gpus` GPUs) in force at its step: the last with change.step <= step; rows
        before the first change, and every row when schedule is empty, use physical_to_logical_map [L, P].
        Recomputed only for rows that changed, or whose layout changed, since the last call."""
        if gpus != self._loads_gpus:
            self._reserve_loads(gpus)
            self._loads_CLG = np.zeros((self.capacity, self.num_layers, gpus), dtype=np.float32)
            self._rows = _RowCache.empty(self.capacity, self.num_layers, gpus)
            self._loads_version_C[:] = -1
            self._weights_by_key = {}
            self._loads_gpus = gpus
        rows = self.ordered_slots() if self.size < self.capacity else np.arange(self.capacity)
        base_key, maps, want_key = self._layout_keys(physical_to_logical_map, schedule, rows)
        stale_mask = (self._loads_version_C[rows] != self.row_version_C[rows]) | (self._loads_key_C[rows] != want_key)
        if stale_mask.any():
            stale, stale_key = rows[stale_mask], want_key[stale_mask]
            for key in np.unique(stale_key).tolist():
                these = stale[stale_key == key] if len(maps) > 1 else stale
                weights_LEG = self._weights_by_key.get(key)
                if weights_LEG is None:
                    weights_LEG = self._weights_by_key[key] = gpu_weights(maps[key], self.num_experts, gpus)
                for chunk in self._chunks(these):  # never a float copy of the whole [C, L, E] ring
                    self._loads_CLG[chunk] = weighted_loads(self.counts_CLE[chunk], weights_LEG)
            for chunk in self._chunks(stale):
                self._rows.update(chunk, self._loads_CLG[chunk])
            self._loads_version_C[stale] = self.row_version_C[stale]
            self._loads_key_C[stale] = stale_key
        for key in self._weights_by_key.keys() - maps.keys():  # layouts no longer in use
            del self._weights_by_key[key]
        if base_key not in self._weights_by_key:  # rows all under other layouts: keep the base one's at hand
            self._weights_by_key[base_key] = gpu_weights(physical_to_logical_map, self.num_experts, gpus)
        self._weights_LEG = self._weights_by_key[base_key]
        return self._loads_CLG

    def _layout_keys(self, physical_to_logical_map, schedule: Sequence[LayoutChange],
                     rows: np.ndarray) -> tuple[int, dict, np.ndarray]:
        """(key of the base map, {key: map} of every layout in use, int64 [len(rows)] the key of each row's)."""
        base_key = hash(np.asarray(physical_to_logical_map, dtype=np.int64).tobytes())
        maps = {base_key: physical_to_logical_map}
        for change in schedule:
            maps.setdefault(change.key, change.layout_LP)
        if not schedule:
            return base_key, maps, np.full(rows.size, base_key, dtype=np.int64)
        starts = np.fromiter((c.step for c in schedule), dtype=np.int64, count=len(schedule))
        keys = np.fromiter((base_key, *(c.key for c in schedule)), dtype=np.int64, count=len(schedule) + 1)
        return base_key, maps, keys[index_in_force(starts, self.step_C[rows]) + 1]  # -1: before every change

    def row_times(self, slots: np.ndarray, model: TimeModel, physical_to_logical_map,
                  schedule: Sequence[LayoutChange] = ()) -> ReducedTimes | None:
        """ReducedTimes (core.costmodel) of the given rows' predicted GPU times under model: each
        row's slot tokens under the layout in force at its step (even split), a rollup bucket's as its mean
        step. Recomputed only for rows that changed, whose layout changed, or all when the model did, a chunk
        of rows at a time (never a float copy of the whole ring). None when the budget cannot hold them."""
        slots = np.asarray(slots, dtype=np.int64)
        if self._times is None or not self._times.fits(model):
            wanted = self.capacity * _TimeCache.row_bytes(self.num_layers)
            if not self._reservation.resize_to(self._held_bytes + self._loads_bytes + wanted):
                return None
            self._times, self._times_bytes = _TimeCache.empty(model, self.capacity, self.num_layers), wanted
        cache = self._times
        _, maps, want_key = self._layout_keys(physical_to_logical_map, schedule, slots)
        stale_mask = (cache.version_C[slots] != self.row_version_C[slots]) | (cache.key_C[slots] != want_key)
        if stale_mask.any():
            stale, stale_key = slots[stale_mask], want_key[stale_mask]
            for key in np.unique(stale_key).tolist():
                layout_LP = np.asarray(maps[key], dtype=np.int64)
                these = stale[stale_key == key]
                row_bytes = self.num_layers * max(layout_LP.shape[1], self.num_experts) * 8 * TIME_TEMPORARIES
                per = max(1, CHUNK_BYTES // row_bytes)
                for start in range(0, these.size, per):
                    chunk = these[start:start + per]
                    counts = self.counts_CLE[chunk].astype(np.float64)
                    if self.resolution_s:  # a bucket's mean step
                        counts /= np.maximum(self.steps_C[chunk], 1)[:, None, None]
                    times = model.gpu_times(slot_weights(counts, layout_LP))
                    cache.update(chunk, reduce_times(times, model.ridge_tokens))
            cache.version_C[stale] = self.row_version_C[stale]
            cache.key_C[stale] = stale_key
        return cache.of(slots)

    def row_stats(self, slots: np.ndarray) -> RowStats:
        """Per-row statistics of the GPU loads of the given rows, as of the last loads_CLG() / view() (kept with
        the loads, recomputed only for the rows whose loads were): see RowStats."""
        return self._rows.of(np.asarray(slots, dtype=np.int64))

    def pending(self, slots: np.ndarray, now_s: float | None = None, grace_s: float = PENDING_GRACE_S) -> np.ndarray:
        """bool [len(slots)]: rows still missing ranks (fewer than the world size) and younger than grace_s,
        both by the reader's clock (now_s, default time.time()) and by the newest step's time (clock skew,
        replays of old traces)."""
        now_s = time.time() if now_s is None else now_s
        newest = self.time_s_C[self.ordered_slots()].max() if self.size else now_s
        age_s = np.maximum(now_s - self.time_s_C[slots], newest - self.time_s_C[slots])
        return (self.ranks_C[slots] < self.world_C[slots]) & (age_s < grace_s)

    def view(self, phase: str, physical_to_logical_map, gpus: int, now_s: float | None = None,
             schedule: Sequence[LayoutChange] = ()) -> WindowView:
        """Rows passing the phase filter ('both', 'prefill' or 'decode'), oldest first, with GPU loads (each
        step's under the layout in force at that step: see loads_CLG). Steps whose ranks have not all
        arrived are left out until PENDING_GRACE_S old (see pending())."""
        if phase not in PHASE_FILTERS:
            raise ValueError(f"phase filter must be one of {tuple(PHASE_FILTERS)}, got {phase!r}")
        codes = PHASE_FILTERS[phase]
        loads_CLG = self.loads_CLG(physical_to_logical_map, gpus, schedule)
        slots = self.ordered_slots()
        slots = slots[np.isin(self.phase_C[slots], codes)]
        counts_sum_LE = self.sums_by_phase_LE[codes[0]].copy()
        for code in codes[1:]:
            counts_sum_LE += self.sums_by_phase_LE[code]
        waiting = self.pending(slots, now_s)
        if waiting.any():
            counts_sum_LE = counts_sum_LE - self.sum_counts(slots[waiting])
            slots = slots[~waiting]
        return WindowView(
            slots_T=slots, step_T=self.step_C[slots], time_s_T=self.time_s_C[slots],
            tokens_T=self.tokens_C[slots], ranks_T=self.ranks_C[slots],
            phase_T=np.asarray(core.PHASES, dtype=object)[self.phase_C[slots]],
            loads_TLG=loads_CLG[slots], counts_sum_LE=counts_sum_LE, steps_T=self.steps_C[slots],
        )

    def missing_ranks(self, slots: np.ndarray) -> MissingRanks:
        """Which ranks the given rows lack (rows with fewer ranks than their world size; a view leaves out rows
        still within the grace period, so these are ranks that never came: the aggregator gave up on them, or
        their records were lost)."""
        slots = np.asarray(slots, dtype=np.int64)
        short = slots[self.ranks_C[slots] < self.world_C[slots]]
        if short.size == 0:
            return MissingRanks()
        per_rank: dict[int, int] = {}
        total = 0
        for slot in short.tolist():
            world = int(self.world_C[slot])
            absent = np.ones(world, dtype=bool)
            absent[[rank for rank in self._ranks_seen[slot] if rank < world]] = False
            ranks = np.flatnonzero(absent)
            total += int(ranks.size)
            for rank in ranks[:MAX_MISSING_LISTED].tolist():
                per_rank[rank] = per_rank.get(rank, 0) + 1
        listed = sorted(per_rank.items(), key=lambda item: (-item[1], item[0]))[:MAX_MISSING_LISTED]
        return MissingRanks(rank_steps=total, steps=int(short.size), by_rank=tuple(listed))

    def holds(self, step: int) -> bool:
        """Whether the ring has a row of this step."""
        return step in self._slot_of_step

    @property
    def newest_step(self) -> int | None:
        """The highest step id in the ring (None when empty)."""
        return int(self.step_C[self.ordered_slots()].max()) if self.size else None

    def layer_counts(self, slots_T: np.ndarray, layer: int) -> np.ndarray:
        """int [T, E] counts of one layer for the given ring rows (int32, int64 once sums outgrew int32)."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        return self.counts_CLE[slots_T, layer, :]

    def latest_complete(self, view: WindowView) -> int:
        """Index in the view of the newest step whose ranks have all arrived (else the newest step).
        ValueError for an empty view."""
        if view.num_steps == 0:
            raise ValueError("an empty view has no latest step")
        complete = np.flatnonzero(view.ranks_T >= self.world_C[view.slots_T])
        return int(complete[-1]) if complete.size else view.num_steps - 1

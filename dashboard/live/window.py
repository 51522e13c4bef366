"""A ring of the last C steps of one run, ranks of the same step summed, with cached GPU loads.

Counts are kept as int32 (what one rank sends) and the ring turns int64 the first time a sum over the
ranks of a step would not fit int32, so sums are exact and an ordinary window costs 4 bytes a cell
(600 x 58 x 256: 35.6 MB; 71.3 MB once promoted).

GPU loads are cached per row with the row's version and the key of the layout they were computed under:
a tick recomputes only the rows that changed, or whose layout changed (a layout change that arrived after
its steps, a new override), never the whole window.

Shape legend: C ring capacity (steps), T steps in a view, L layers, E logical experts, G GPUs.
"""
from __future__ import annotations

import math
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import wire
from dashboard.live.layout_changes import LayoutChange
from planner.loads import gpu_weights, weighted_loads

PHASE_CODE = {name: code for code, name in enumerate(wire.PHASES)}
PHASE_FILTERS = {"both": tuple(range(len(wire.PHASES))), "prefill": (PHASE_CODE["prefill"],),
                 "decode": (PHASE_CODE["decode"],)}
_MIXED = PHASE_CODE["mixed"]
PENDING_GRACE_S = 5.0  # a step still missing ranks is left out of views until it is this old
MAX_CAPACITY = 65536  # steps a window may hold
MAX_WINDOW_BYTES = 2 << 30  # int32 counts of the ring (twice that once promoted to int64)
_INT32_MAX = int(np.iinfo(np.int32).max)


def bounded_int(value, name: str, lo: int, hi: int) -> int:
    """value as an int with lo <= value < hi (numpy integers welcome, bools not); ValueError otherwise."""
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
    if isinstance(value, bool) or not lo <= number < hi:
        raise ValueError(f"{name} is outside {lo}..{hi - 1}")
    return int(number)


@dataclass
class WindowView:
    """The steps of a window that pass a phase filter, oldest first.

    slots_T: ring rows; step_T, time_s_T, tokens_T, ranks_T, phase_T (str); loads_TLG float32 GPU loads,
    each step's under the layout in force at that step; counts_sum_LE int64 tokens per expert summed over
    these steps."""

    slots_T: np.ndarray
    step_T: np.ndarray
    time_s_T: np.ndarray
    tokens_T: np.ndarray
    ranks_T: np.ndarray
    phase_T: np.ndarray
    loads_TLG: np.ndarray
    counts_sum_LE: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.slots_T.size)


class StepWindow:
    """The last `capacity` steps of a run. add() sums the ranks of a step into one row; a step older than
    everything in a full ring, a duplicate (step, rank) or a record of another shape is refused with
    ValueError so the caller can count it as a bad record."""

    def __init__(self, capacity: int, num_layers: int, num_experts: int):
        if capacity < 1 or num_layers < 1 or num_experts < 1:
            raise ValueError(f"window needs capacity, layers and experts >= 1, got {capacity}, {num_layers}, {num_experts}")
        num_layers, num_experts, _ = wire.check_sizes(num_layers, num_experts)
        capacity = bounded_int(capacity, "window capacity", 1, MAX_CAPACITY + 1)
        if capacity * num_layers * num_experts * 4 > MAX_WINDOW_BYTES:
            fits = MAX_WINDOW_BYTES // (num_layers * num_experts * 4)
            raise ValueError(f"a window of {capacity} steps of [{num_layers}, {num_experts}] counts would take "
                             f"{capacity * num_layers * num_experts * 4 / 2**30:.1f} GiB; at most {fits} steps fit "
                             f"in {MAX_WINDOW_BYTES / 2**30:.0f} GiB: lower the window")
        self.capacity, self.num_layers, self.num_experts = capacity, num_layers, num_experts
        self.counts_CLE = np.zeros((capacity, num_layers, num_experts), dtype=np.int32)
        self.step_C = np.full(capacity, -1, dtype=np.int64)
        self.time_s_C = np.zeros(capacity, dtype=np.float64)
        self.tokens_C = np.zeros(capacity, dtype=np.int64)
        self.ranks_C = np.zeros(capacity, dtype=np.int32)
        self.world_C = np.ones(capacity, dtype=np.int32)
        self.phase_C = np.zeros(capacity, dtype=np.int8)
        self.row_version_C = np.zeros(capacity, dtype=np.int64)
        # per phase code (wire.PHASES order): counts summed over the steps of that phase in the ring, [phases, L, E]
        self.sums_by_phase_LE = np.zeros((len(wire.PHASES), num_layers, num_experts), dtype=np.int64)
        self._ranks_seen: list[set[int]] = [set() for _ in range(capacity)]
        self._slot_of_step: dict[int, int] = {}
        self.size = 0
        self.head = 0  # next slot to write
        self.dropped_by_rank: dict[int, int] = {}
        self._version = 0
        self._loads_gpus = 0  # G of the cached loads (0: none yet)
        self._loads_CLG = np.zeros((0, self.num_layers, 0), dtype=np.float32)  # sized at the first loads_CLG()
        self._loads_version_C = np.full(capacity, -1, dtype=np.int64)  # row version the cached loads are of
        self._loads_key_C = np.zeros(capacity, dtype=np.int64)  # key of the layout they were computed under
        self._weights_by_key: dict[int, np.ndarray] = {}  # layout key -> gpu_weights [L, E, G]
        self._weights_LEG = np.zeros((self.num_layers, self.num_experts, 0))  # the base layout's weights

    # ------------------------------------------------------------------------------------------ writes
    def add(self, rec: wire.StepRecord) -> None:
        """Sum one rank's record into the row of its step (a new row for a new step). Everything is checked and
        converted before anything changes: a refused record (ValueError) leaves the window as it was."""
        counts, step, rank, world, tokens, dropped, time_s, code = self._checked(rec)
        slot = self._slot_of_step.get(step)
        if slot is not None:
            if rank in self._ranks_seen[slot]:
                raise ValueError(f"step {step} rank {rank} arrived twice")
            if self.counts_CLE.dtype == np.int32 and int(self.counts_CLE[slot].max()) + int(counts.max()) > _INT32_MAX:
                self.counts_CLE = self.counts_CLE.astype(np.int64)  # exact sums from now on (values unchanged)
        elif self.size == self.capacity and step < self.step_C[self.head]:
            raise ValueError(f"step {step} is older than the window (oldest kept: {self.step_C[self.head]})")
        # nothing below raises: every value was checked and converted above
        self._version += 1
        self.dropped_by_rank[rank] = max(self.dropped_by_rank.get(rank, 0), dropped)
        if slot is not None:
            self._ranks_seen[slot].add(rank)
            old = int(self.phase_C[slot])
            self.sums_by_phase_LE[old] -= self.counts_CLE[slot]
            self.counts_CLE[slot] += counts
            self.phase_C[slot] = old if old == code else _MIXED
            self.sums_by_phase_LE[self.phase_C[slot]] += self.counts_CLE[slot]
            self.time_s_C[slot] = max(self.time_s_C[slot], time_s)
            self.tokens_C[slot] += tokens
            self.ranks_C[slot] += 1
            self.row_version_C[slot] = self._version
            return
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
        self.phase_C[slot], self.ranks_C[slot], self.world_C[slot] = code, 1, world
        self._ranks_seen[slot] = {rank}
        self._slot_of_step[step] = slot
        self.row_version_C[slot] = self._version

    def _checked(self, rec: wire.StepRecord) -> tuple[np.ndarray, int, int, int, int, int, float, int]:
        """(counts, step, rank, world, tokens, dropped, time_s, phase code) of rec, within the bounds of
        wire/keys.py; ValueError naming what is wrong."""
        step, rank, world, tokens, dropped, time_s, code = check_record(rec)
        counts = rec.counts_LE
        if not isinstance(counts, np.ndarray) or counts.shape != (self.num_layers, self.num_experts):
            shape = counts.shape if isinstance(counts, np.ndarray) else type(counts).__name__
            raise ValueError(f"step {rec.step} rank {rec.rank}: counts are {shape}, "
                             f"this run is [{self.num_layers}, {self.num_experts}]")
        if counts.dtype.kind not in "iu":
            raise ValueError(f"counts must be integers, got {counts.dtype}")
        if int(counts.min()) < 0:
            raise ValueError("counts contain negative values")
        if counts.dtype != np.int32 and int(counts.max()) > _INT32_MAX:
            raise ValueError(f"counts must lie in 0..{_INT32_MAX} (int32, as on the wire)")
        return counts, step, rank, world, tokens, dropped, time_s, code

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
            self._loads_CLG = np.zeros((self.capacity, self.num_layers, gpus), dtype=np.float32)
            self._loads_version_C[:] = -1
            self._weights_by_key = {}
            self._loads_gpus = gpus
        base_key = hash(np.asarray(physical_to_logical_map, dtype=np.int64).tobytes())
        maps = {base_key: physical_to_logical_map}
        for change in schedule:
            maps.setdefault(change.key, change.p2l_LP)
        rows = self.ordered_slots() if self.size < self.capacity else np.arange(self.capacity)
        if schedule:
            starts = np.fromiter((c.step for c in schedule), dtype=np.int64, count=len(schedule))
            keys = np.fromiter((base_key, *(c.key for c in schedule)), dtype=np.int64, count=len(schedule) + 1)
            want_key = keys[np.searchsorted(starts, self.step_C[rows], side="right")]
        else:
            want_key = np.full(rows.size, base_key, dtype=np.int64)
        stale_mask = (self._loads_version_C[rows] != self.row_version_C[rows]) | (self._loads_key_C[rows] != want_key)
        if stale_mask.any():
            stale, stale_key = rows[stale_mask], want_key[stale_mask]
            for key in np.unique(stale_key).tolist():
                these = stale[stale_key == key] if len(maps) > 1 else stale
                weights_LEG = self._weights_by_key.get(key)
                if weights_LEG is None:
                    weights_LEG = self._weights_by_key[key] = gpu_weights(maps[key], self.num_experts, gpus)
                self._loads_CLG[these] = weighted_loads(self.counts_CLE[these], weights_LEG)
            self._loads_version_C[stale] = self.row_version_C[stale]
            self._loads_key_C[stale] = stale_key
        for key in self._weights_by_key.keys() - maps.keys():  # layouts no longer in use
            del self._weights_by_key[key]
        if base_key not in self._weights_by_key:  # rows all under other layouts: keep the base one's at hand
            self._weights_by_key[base_key] = gpu_weights(physical_to_logical_map, self.num_experts, gpus)
        self._weights_LEG = self._weights_by_key[base_key]
        return self._loads_CLG

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
        counts_sum_LE = self.sums_by_phase_LE[list(codes)].sum(axis=0)
        waiting = self.pending(slots, now_s)
        if waiting.any():
            counts_sum_LE = counts_sum_LE - self.counts_CLE[slots[waiting]].sum(axis=0, dtype=np.int64)
            slots = slots[~waiting]
        return WindowView(
            slots_T=slots, step_T=self.step_C[slots], time_s_T=self.time_s_C[slots],
            tokens_T=self.tokens_C[slots], ranks_T=self.ranks_C[slots],
            phase_T=np.asarray(wire.PHASES, dtype=object)[self.phase_C[slots]],
            loads_TLG=loads_CLG[slots], counts_sum_LE=counts_sum_LE,
        )

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


def check_record(rec: wire.StepRecord) -> tuple[int, int, int, int, int, float, int]:
    """(step, rank, world, tokens, dropped, time_s, phase code) of rec as plain numbers within the bounds of
    wire/keys.py, and its instance id a short string; ValueError naming what is wrong. (Records from
    wire.decode_step always pass; this guards the window's int64 arrays against any other source.)"""
    step = bounded_int(rec.step, "step", 0, wire.MAX_STEP)
    rank = bounded_int(rec.rank, "rank", 0, wire.MAX_WORLD)
    world = bounded_int(rec.world_size, "world size", 1, wire.MAX_WORLD + 1)
    if rank >= world:
        raise ValueError(f"rank {rank} is not below world size {world}")
    tokens = bounded_int(rec.tokens, "tokens", 0, wire.MAX_TOKENS)
    dropped = bounded_int(rec.dropped_steps, "dropped steps", 0, wire.MAX_STEP)
    try:
        time_s = float(rec.time_s)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"time must be a number, got {type(rec.time_s).__name__}") from None
    if not (math.isfinite(time_s) and abs(time_s) < wire.MAX_TIME_S):
        raise ValueError(f"time {time_s} is not a finite time below {wire.MAX_TIME_S:g} s")
    code = PHASE_CODE.get(rec.phase) if isinstance(rec.phase, str) else None
    if code is None:
        raise ValueError(f"unknown phase {str(rec.phase)[:40]!r}")
    if not isinstance(rec.instance, str) or len(rec.instance) > wire.MAX_NAME_CHARS:
        raise ValueError(f"collector instance id must be text of at most {wire.MAX_NAME_CHARS} characters")
    return step, rank, world, tokens, dropped, time_s, code

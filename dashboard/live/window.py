"""A ring of the last C steps of one run, ranks of the same step summed, with cached GPU loads.

Shape legend: C ring capacity (steps), T steps in a view, L layers, E logical experts, G GPUs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

import wire
from planner.loads import gpu_weights, weighted_loads

PHASE_CODE = {name: code for code, name in enumerate(wire.PHASES)}
PHASE_FILTERS = {"both": tuple(range(len(wire.PHASES))), "prefill": (PHASE_CODE["prefill"],),
                 "decode": (PHASE_CODE["decode"],)}
_MIXED = PHASE_CODE["mixed"]
PENDING_GRACE_S = 5.0  # a step still missing ranks is left out of views until it is this old


@dataclass
class WindowView:
    """The steps of a window that pass a phase filter, oldest first.

    slots_T: ring rows; step_T, time_s_T, tokens_T, ranks_T, phase_T (str); loads_TLG float32 GPU loads
    under the window's layout; counts_sum_LE int64 tokens per expert summed over these steps."""

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
        self._loads_key: tuple[int, int] | None = None
        self._loads_CLG = np.zeros((0, self.num_layers, 0), dtype=np.float32)  # sized at the first loads_CLG()
        self._loads_version_C = np.full(capacity, -1, dtype=np.int64)

    # ------------------------------------------------------------------------------------------ writes
    def add(self, rec: wire.StepRecord) -> None:
        """Sum one rank's record into the row of its step (a new row for a new step)."""
        if rec.counts_LE.shape != (self.num_layers, self.num_experts):
            raise ValueError(f"step {rec.step} rank {rec.rank}: counts are {rec.counts_LE.shape}, "
                             f"this run is [{self.num_layers}, {self.num_experts}]")
        self._version += 1
        self.dropped_by_rank[rec.rank] = max(self.dropped_by_rank.get(rec.rank, 0), rec.dropped_steps)
        code = PHASE_CODE[rec.phase]
        slot = self._slot_of_step.get(rec.step)
        if slot is not None:
            if rec.rank in self._ranks_seen[slot]:
                raise ValueError(f"step {rec.step} rank {rec.rank} arrived twice")
            self._ranks_seen[slot].add(rec.rank)
            old = int(self.phase_C[slot])
            self.sums_by_phase_LE[old] -= self.counts_CLE[slot]
            self.counts_CLE[slot] += rec.counts_LE
            self.phase_C[slot] = old if old == code else _MIXED
            self.sums_by_phase_LE[self.phase_C[slot]] += self.counts_CLE[slot]
            self.time_s_C[slot] = max(self.time_s_C[slot], rec.time_s)
            self.tokens_C[slot] += rec.tokens
            self.ranks_C[slot] += 1
            self.row_version_C[slot] = self._version
            return
        if self.size == self.capacity and rec.step < self.step_C[self.head]:
            raise ValueError(f"step {rec.step} is older than the window (oldest kept: {self.step_C[self.head]})")
        slot = self.head
        if self.size == self.capacity:
            self.sums_by_phase_LE[self.phase_C[slot]] -= self.counts_CLE[slot]
            del self._slot_of_step[int(self.step_C[slot])]
        else:
            self.size += 1
        self.head = (self.head + 1) % self.capacity
        self.counts_CLE[slot] = rec.counts_LE
        self.sums_by_phase_LE[code] += rec.counts_LE
        self.step_C[slot], self.time_s_C[slot], self.tokens_C[slot] = rec.step, rec.time_s, rec.tokens
        self.phase_C[slot], self.ranks_C[slot], self.world_C[slot] = code, 1, rec.world_size
        self._ranks_seen[slot] = {rec.rank}
        self._slot_of_step[rec.step] = slot
        self.row_version_C[slot] = self._version

    # ------------------------------------------------------------------------------------------ reads
    def ordered_slots(self) -> np.ndarray:
        """Ring rows oldest first: int64 [size]."""
        start = (self.head - self.size) % self.capacity
        return (start + np.arange(self.size)) % self.capacity

    def loads_CLG(self, physical_to_logical_map, gpus: int) -> np.ndarray:
        """GPU loads of every ring row under this layout, recomputed only for rows that changed since the
        last call with the same layout."""
        key = (gpus, hash(np.asarray(physical_to_logical_map, dtype=np.int64).tobytes()))
        if key != self._loads_key:
            self._weights_LEG = gpu_weights(physical_to_logical_map, self.num_experts, gpus)
            self._loads_CLG = np.zeros((self.capacity, self.num_layers, gpus), dtype=np.float32)
            self._loads_version_C[:] = -1
            self._loads_key = key
        stale = np.flatnonzero(self._loads_version_C != self.row_version_C)
        stale = stale[np.isin(stale, self.ordered_slots())] if self.size < self.capacity else stale
        if stale.size:
            self._loads_CLG[stale] = weighted_loads(self.counts_CLE[stale], self._weights_LEG)
            self._loads_version_C[stale] = self.row_version_C[stale]
        return self._loads_CLG

    def pending(self, slots: np.ndarray, now_s: float | None = None, grace_s: float = PENDING_GRACE_S) -> np.ndarray:
        """bool [len(slots)]: rows still missing ranks (fewer than the world size) and younger than grace_s,
        both by the reader's clock (now_s, default time.time()) and by the newest step's time (clock skew,
        replays of old traces)."""
        now_s = time.time() if now_s is None else now_s
        newest = self.time_s_C[self.ordered_slots()].max() if self.size else now_s
        age_s = np.maximum(now_s - self.time_s_C[slots], newest - self.time_s_C[slots])
        return (self.ranks_C[slots] < self.world_C[slots]) & (age_s < grace_s)

    def view(self, phase: str, physical_to_logical_map, gpus: int, now_s: float | None = None) -> WindowView:
        """Rows passing the phase filter ('both', 'prefill' or 'decode'), oldest first, with GPU loads.
        Steps whose ranks have not all arrived are left out until PENDING_GRACE_S old (see pending())."""
        if phase not in PHASE_FILTERS:
            raise ValueError(f"phase filter must be one of {tuple(PHASE_FILTERS)}, got {phase!r}")
        codes = PHASE_FILTERS[phase]
        loads_CLG = self.loads_CLG(physical_to_logical_map, gpus)
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

    def layer_counts(self, slots_T: np.ndarray, layer: int) -> np.ndarray:
        """int32 [T, E] counts of one layer for the given ring rows."""
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

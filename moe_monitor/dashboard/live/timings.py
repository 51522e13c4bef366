"""A ring of the layer timings (core.TimingRecord) of the last C steps of one run, one row per step, every rank
of that step in it. Pure: no Streamlit, no I/O.

It holds as many steps as the step window and drops its oldest row the same way; pages align it with a window
view by step id (aligned()): a step without timings reads NaN (not measured). Its arrays are reserved from
core.membudget.current() when the first record sizes them; a ring the budget cannot hold, or over
MAX_TIMING_BYTES, refuses its records (ValueError naming the limit).

Shape legend: C ring capacity (steps), T steps of a view, R ranks (the run's world size), L MoE layers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core import membudget
from moe_monitor.dashboard.live.record_checks import bounded_int

MAX_TIMING_BYTES = 256 << 20  # the four float32 [C, R, L] arrays together; a larger ring is refused


@dataclass(frozen=True)
class TimingView:
    """Timings of the steps step_T (oldest first), in seconds, NaN = not measured: dispatch_TRL, compute_TRL,
    combine_TRL, layer_TRL float32 [T, R, L]; has_T bool [T]: the step has a timing record of some rank."""

    step_T: np.ndarray
    dispatch_TRL: np.ndarray
    compute_TRL: np.ndarray
    combine_TRL: np.ndarray
    layer_TRL: np.ndarray
    has_T: np.ndarray

    @property
    def num_steps(self) -> int:
        return int(self.step_T.size)

    @property
    def num_ranks(self) -> int:
        return int(self.layer_TRL.shape[1])

    @property
    def num_layers(self) -> int:
        return int(self.layer_TRL.shape[2])

    @property
    def any(self) -> bool:
        """True when at least one step in view has a timing record."""
        return bool(self.has_T.any())


class TimingRing:
    """The timings of the last `capacity` steps. Sized ([C, R, L]) at the first record (R its world size, L
    its layers); add() refuses with ValueError (the caller counts a bad record): a record of another world
    size or layer count, a duplicate (step, rank), a step older than everything in a full ring."""

    def __init__(self, capacity: int, budget: membudget.MemoryBudget | None = None):
        if capacity < 1:
            raise ValueError(f"timing ring capacity must be at least 1, got {capacity}")
        self.capacity = int(capacity)
        self.budget = membudget.current() if budget is None else budget
        self._reservation: membudget.Reservation | None = None
        self.num_ranks = 0
        self.num_layers = 0
        self.dispatch_CRL = self.compute_CRL = self.combine_CRL = self.layer_CRL = np.zeros((0, 0, 0), np.float32)
        self.step_C = np.full(self.capacity, -1, dtype=np.int64)
        self.ranks_seen_CR = np.zeros((self.capacity, 0), dtype=bool)
        self._slot_of_step: dict[int, int] = {}
        self.size = 0
        self.head = 0  # next slot to write
        self.records = 0  # records taken

    def _allocate(self, ranks: int, layers: int) -> None:
        if self.capacity * ranks * layers * 4 * 4 > MAX_TIMING_BYTES:
            raise ValueError(f"timings of {self.capacity} steps x {ranks} ranks x {layers} layers would take more "
                             f"than {MAX_TIMING_BYTES >> 20} MiB: lower the window")
        nbytes = self.capacity * ranks * (layers * 4 * 4 + 1)
        reservation = self.budget.try_reserve(nbytes)
        if reservation is None:
            raise ValueError(f"timings of {self.capacity} steps x {ranks} ranks x {layers} layers need "
                             f"{membudget.format_bytes(nbytes)} and {self.budget.describe()} has "
                             f"{membudget.format_bytes(self.budget.available_bytes)} left: it is shared by "
                             f"{self.budget.shared_by}")
        self._reservation = reservation  # given back when the ring is dropped (core.membudget.Reservation)
        shape = (self.capacity, ranks, layers)
        self.dispatch_CRL, self.compute_CRL, self.combine_CRL, self.layer_CRL = (
            np.full(shape, np.nan, dtype=np.float32) for _ in range(4))
        self.ranks_seen_CR = np.zeros((self.capacity, ranks), dtype=bool)
        self.num_ranks, self.num_layers = ranks, layers

    @property
    def reserved_bytes(self) -> int:
        """Bytes this ring holds of its budget now (0 before its first record and after close())."""
        held = self._reservation
        return 0 if held is None or held.released else held.nbytes

    def close(self) -> None:
        """Give the ring's bytes back to its budget now (also done when it is garbage-collected); the ring must
        not be used afterwards."""
        if self._reservation is not None:
            self._reservation.release()

    def add(self, rec: core.TimingRecord) -> None:
        """Put one rank's timings of one step in the ring; a refused record (ValueError) changes nothing."""
        step = bounded_int(rec.step, "step", 0, core.MAX_STEP)
        world = bounded_int(rec.world_size, "world size", 1, core.MAX_WORLD + 1)
        rank = bounded_int(rec.rank, "rank", 0, world)
        arrays = [np.asarray(a) for a in rec.arrays()]
        if any(a.ndim != 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1 or arrays[0].shape[0] < 1:
            raise ValueError("timing arrays must be 1-D [layers] of one length")
        layers = int(arrays[0].shape[0])
        times = [a.astype(np.float32) for a in arrays]
        for name, times_L in zip(core.TIMING_PHASES, times):
            measured = times_L[~np.isnan(times_L)]
            if measured.size and not (np.isfinite(measured).all() and measured.min() >= 0
                                      and measured.max() < core.MAX_PHASE_S):
                raise ValueError(f"{name} times must be NaN (not measured) or finite, >= 0, below "
                                 f"{core.MAX_PHASE_S:g} s")
        if self.num_layers and (world, layers) != (self.num_ranks, self.num_layers):
            raise ValueError(f"timings of {world} ranks x {layers} layers, this run's are {self.num_ranks} x "
                             f"{self.num_layers}")
        slot = self._slot_of_step.get(step)
        if slot is not None and self.ranks_seen_CR[slot, rank]:
            raise ValueError(f"timings of step {step} rank {rank} arrived twice")
        if slot is None and self.size == self.capacity and step < self.step_C[self.head]:
            raise ValueError(f"timings of step {step} are older than the window (oldest kept: "
                             f"{self.step_C[self.head]})")
        if not self.num_layers:
            self._allocate(world, layers)
        if slot is None:
            slot = self.head
            if self.size == self.capacity:
                del self._slot_of_step[int(self.step_C[slot])]
            else:
                self.size += 1
            self.head = (self.head + 1) % self.capacity
            for phase_CRL in (self.dispatch_CRL, self.compute_CRL, self.combine_CRL, self.layer_CRL):
                phase_CRL[slot] = np.nan
            self.ranks_seen_CR[slot] = False
            self.step_C[slot] = step
            self._slot_of_step[step] = slot
        for phase_CRL, times_L in zip((self.dispatch_CRL, self.compute_CRL, self.combine_CRL, self.layer_CRL), times):
            phase_CRL[slot, rank] = times_L
        self.ranks_seen_CR[slot, rank] = True
        self.records += 1

    def aligned(self, step_T) -> TimingView:
        """The timings of the steps step_T (int [T], a window view's step ids), NaN for steps not in the ring."""
        step_T = np.asarray(step_T, dtype=np.int64)
        rows_T = np.fromiter((self._slot_of_step.get(int(s), -1) for s in step_T), dtype=np.int64,
                             count=step_T.size)
        has_T = rows_T >= 0
        shape = (step_T.size, self.num_ranks, self.num_layers)
        out = []
        for phase_CRL in (self.dispatch_CRL, self.compute_CRL, self.combine_CRL, self.layer_CRL):
            phase_TRL = np.full(shape, np.nan, dtype=np.float32)
            if has_T.any():
                phase_TRL[has_T] = phase_CRL[rows_T[has_T]]
            out.append(phase_TRL)
        return TimingView(step_T=step_T, dispatch_TRL=out[0], compute_TRL=out[1], combine_TRL=out[2],
                          layer_TRL=out[3], has_T=has_T)

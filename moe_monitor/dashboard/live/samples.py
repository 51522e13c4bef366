"""Sampled routing rows of the last steps, kept for the What-if traffic model (the StepWindow keeps only
counts). The WatchedRun feeds every accepted StepRecord here; the What-if page asks for the rows of the
steps it scores on, with the rank each row was sampled on (a token's dispatch starts at its own rank).

Memory: the ring reserves the bytes it keeps from the process's memory budget (core.membudget.current() when
it is made) as it fills, a chunk at a time, up to max_bytes; when the budget has no more, the ring keeps what it
holds and drops its oldest steps sooner, and budget_note says so.

Shape legend: L layers, N sampled tokens (all ranks of the kept steps, concatenated), K top-k.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core import membudget

DEFAULT_MAX_BYTES = 64 << 20
RESERVE_CHUNK_BYTES = 1 << 20  # the ring's reservation grows by at least this much at a time


@dataclass(frozen=True)
class SampledRows:
    """ids_LNK int16 top-k expert ids (-1 = masked); rank_N int32 source rank of every row; world_size of
    the newest record kept (ranks are 0..world_size - 1)."""

    ids_LNK: np.ndarray
    rank_N: np.ndarray
    world_size: int

    def tail(self, max_rows: int) -> SampledRows:
        """The newest max_rows rows (all when fewer)."""
        if self.ids_LNK.shape[1] <= max_rows:
            return self
        return SampledRows(self.ids_LNK[:, -max_rows:], self.rank_N[-max_rows:], self.world_size)


class SampleRing:
    """The sample_ids_LNK of the newest `capacity` steps (ranks of a step kept side by side, each with its
    rank), at most `max_bytes` in all and never more than its reservation from `budget` (default
    core.membudget.current()); the oldest steps go first. Records without samples are ignored."""

    def __init__(self, capacity: int, max_bytes: int = DEFAULT_MAX_BYTES,
                 budget: membudget.MemoryBudget | None = None):
        if capacity < 1 or max_bytes < 1:
            raise ValueError(f"capacity and max_bytes must be >= 1, got {capacity}, {max_bytes}")
        self.capacity, self.max_bytes = capacity, max_bytes
        self._rows: OrderedDict[int, list[tuple[int, np.ndarray]]] = OrderedDict()
        self.nbytes = 0
        self.budget = membudget.current() if budget is None else budget
        reservation = self.budget.try_reserve(0)
        if reservation is None:  # unreachable: 0 bytes always fit
            raise ValueError("the memory budget refused an empty reservation")
        self._reservation = reservation  # given back when the ring is dropped (core.membudget.Reservation)
        self.budget_note = ""  # why the ring keeps fewer rows than max_bytes allows ("" when it does not)
        self.top_k: int | None = None
        self.world_size = 1

    def __len__(self) -> int:
        return len(self._rows)

    @staticmethod
    def check(rec: core.StepRecord) -> None:
        """ValueError when rec's sampled rows are not None or an int array [L, N, K] of ids in -1..32767 (what
        core.decode_step lets through); then add(rec) cannot fail."""
        sample = rec.sample_ids_LNK
        if sample is None:
            return
        if not isinstance(sample, np.ndarray) or sample.ndim != 3 or sample.dtype.kind not in "iu":
            raise ValueError("sampled rows must be an int array [L, N, K]")
        if sample.size and (int(sample.min()) < -1 or int(sample.max()) > core.MAX_SAMPLE_EXPERTS):
            raise ValueError("sampled rows hold expert ids outside [-1, E)")

    def add(self, rec: core.StepRecord) -> None:
        """Keep rec's sampled rows (call check(rec) first when rec may not come from core.decode_step)."""
        sample = rec.sample_ids_LNK
        if sample is None or sample.shape[1] == 0:
            return
        if self.top_k is None:
            self.top_k = sample.shape[2]
        if sample.shape[2] != self.top_k:
            return  # another top-k: not the same model; the window refuses such a run anyway
        if rec.step not in self._rows and self._rows and rec.step < next(iter(self._rows)) \
                and len(self._rows) >= self.capacity:
            return  # older than everything kept in a full ring
        kept = np.array(sample, dtype=np.int16)
        if not self._make_room(kept.nbytes):
            return
        held = self._rows.get(rec.step)
        if held is None:
            held = self._rows[rec.step] = []
        held.append((int(rec.rank), kept))
        self.world_size = int(rec.world_size)
        self.nbytes += kept.nbytes
        while len(self._rows) > self.capacity:
            self._drop_oldest()

    def _make_room(self, nbytes: int) -> bool:
        """Room for nbytes more: grow the reservation (up to max_bytes) when the budget allows, else drop the
        oldest steps until they fit what is reserved. False (nothing kept, budget_note says why) when nbytes
        alone exceed what the ring may hold."""
        want = self.nbytes + nbytes
        held = self._reservation.nbytes
        if want > held and held < self.max_bytes:
            ask = min(self.max_bytes, max(want, held + RESERVE_CHUNK_BYTES))
            if not self._reservation.resize_to(ask) and not self._reservation.resize_to(min(self.max_bytes, want)):
                self.budget_note = (f"sampled routing rows: the ring keeps {membudget.format_bytes(held)} of "
                                    f"{membudget.format_bytes(self.max_bytes)}: {self.budget.describe()} is shared "
                                    f"by {self.budget.shared_by}")
        cap = min(self.max_bytes, self._reservation.nbytes)
        if nbytes > cap:
            return False
        while self._rows and self.nbytes + nbytes > cap:
            self._drop_oldest()
        return True

    def _drop_oldest(self) -> None:
        _, gone = self._rows.popitem(last=False)
        self.nbytes -= sum(a.nbytes for _, a in gone)

    @property
    def reserved_bytes(self) -> int:
        """Bytes this ring holds of its budget now."""
        return 0 if self._reservation.released else self._reservation.nbytes

    def close(self) -> None:
        """Give the ring's bytes back to its budget now (also done when it is garbage-collected); the ring must
        not be used afterwards."""
        self._reservation.release()

    def _parts(self, steps) -> list[tuple[int, np.ndarray]]:
        return [part for s in np.asarray(steps, dtype=np.int64).tolist() for part in self._rows.get(int(s), ())]

    def rows(self, steps) -> np.ndarray | None:
        """int16 [L, N, K]: the kept rows of these steps (all ranks), or None when none of them has any."""
        parts = self._parts(steps)
        return np.concatenate([a for _, a in parts], axis=1) if parts else None

    def sampled(self, steps) -> SampledRows | None:
        """The kept rows of these steps with the source rank of each row, or None when there are none."""
        parts = self._parts(steps)
        if not parts:
            return None
        rank_N = np.concatenate([np.full(a.shape[1], r, dtype=np.int32) for r, a in parts])
        return SampledRows(np.concatenate([a for _, a in parts], axis=1), rank_N, self.world_size)

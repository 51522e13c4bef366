"""Sampled routing rows of the last steps, kept for the What-if traffic model (the StepWindow keeps only
counts). The Monitor feeds every accepted StepRecord here; the What-if page asks for the rows of the
steps it scores on.

Shape legend: L layers, N sampled tokens (all ranks of the kept steps, concatenated), K top-k.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

import wire

DEFAULT_MAX_BYTES = 64 << 20


class SampleRing:
    """The sample_ids_LNK of the newest `capacity` steps (ranks of a step kept side by side), at most
    `max_bytes` in all; the oldest steps go first. Records without samples are ignored."""

    def __init__(self, capacity: int, max_bytes: int = DEFAULT_MAX_BYTES):
        if capacity < 1 or max_bytes < 1:
            raise ValueError(f"capacity and max_bytes must be >= 1, got {capacity}, {max_bytes}")
        self.capacity, self.max_bytes = capacity, max_bytes
        self._rows: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self.nbytes = 0
        self.top_k: int | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, rec: wire.StepRecord) -> None:
        sample = rec.sample_ids_LNK
        if sample is None or sample.shape[1] == 0:
            return
        if self.top_k is None:
            self.top_k = sample.shape[2]
        if sample.shape[2] != self.top_k:
            return  # another top-k: not the same model; the window refuses such a run anyway
        held = self._rows.get(rec.step)
        if held is None:
            if self._rows and rec.step < next(iter(self._rows)) and len(self._rows) >= self.capacity:
                return  # older than everything kept in a full ring
            held = self._rows[rec.step] = []
        held.append(np.array(sample, dtype=np.int16))
        self.nbytes += sample.nbytes
        while len(self._rows) > self.capacity or (self.nbytes > self.max_bytes and len(self._rows) > 1):
            _, gone = self._rows.popitem(last=False)
            self.nbytes -= sum(a.nbytes for a in gone)

    def rows(self, steps) -> np.ndarray | None:
        """int16 [L, N, K]: the kept rows of these steps (all ranks), or None when none of them has any."""
        parts = [a for s in np.asarray(steps, dtype=np.int64).tolist() for a in self._rows.get(int(s), ())]
        return np.concatenate(parts, axis=1) if parts else None

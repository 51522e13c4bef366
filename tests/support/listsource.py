"""A Source that hands over prepared batches, for records no decoder would let through (tests of the
watched run's own defences)."""
from __future__ import annotations

import wire
from dashboard.sources.base import Batch, Health


class ListSource:
    """poll() returns the next prepared Batch (an empty one when they run out); meta() returns `meta`."""

    def __init__(self, batches: list[Batch], meta: wire.RunMeta | None = None):
        self.batches = list(batches)
        self._meta = meta

    def poll(self, max_entries: int) -> Batch:
        return self.batches.pop(0) if self.batches else Batch()

    def meta(self) -> wire.RunMeta | None:
        return self._meta

    def health(self) -> Health:
        return Health(reachable=True, where="list")

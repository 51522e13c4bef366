"""The collector-restart rule, once: every record names the collector process that wrote it (its instance id,
one per rank). A rank whose records come from a new instance restarted, and its step ids start again; records of
an instance already replaced are stale. Readers keep, per run, the instance that speaks for each rank and a
bounded set of retired instances, and ask verdict() about every record.

What a reader does on RESTARTED is its own: the aggregator starts a new epoch for the run, the dashboard's window
starts afresh and retires that rank's previous instance."""
from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping


class Verdict(enum.Enum):
    CURRENT = "current"  # the instance that speaks for this rank
    RETIRED = "retired"  # an instance already replaced: its records are stale
    FIRST = "first"  # the first instance seen for this rank
    RESTARTED = "restarted"  # a new instance for a rank that had another: the collector restarted


def verdict(instance_of_rank: Mapping[int, str], retired: RetiredInstances, rank: int, instance: str) -> Verdict:
    """The rule for one record of `rank` written by collector `instance`."""
    known = instance_of_rank.get(rank)
    if known == instance:
        return Verdict.CURRENT
    if instance in retired:
        return Verdict.RETIRED
    return Verdict.FIRST if known is None else Verdict.RESTARTED


class RetiredInstances:
    """Collector instances replaced by newer ones, oldest first, at most max_size (the oldest forgotten first)."""

    def __init__(self, max_size: int, instances: Iterable[str] = ()):
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.max_size = max_size
        self._order: dict[str, None] = {}
        for instance in instances:
            self.add(instance)

    def add(self, instance: str) -> None:
        self._order[instance] = None
        while len(self._order) > self.max_size:
            del self._order[next(iter(self._order))]

    def __contains__(self, instance: object) -> bool:
        return instance in self._order

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

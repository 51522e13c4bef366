"""The collector-restart rule, once: RankInstances.judge() says what one per-rank record is under the restarts
seen so far (CURRENT, FIRST, HELD, REJOINED, NEW_EPOCH, STALE, IMPLAUSIBLE), and capped_world() counts a record
that claims a larger world than the run metadata's under the metadata's. core.assembly.Assembler applies it, in
the aggregator and in the dashboard's reader alike. Pure: no I/O, no clock (record times are the collectors').
The rule in words: docs/scaling.md, "Collector restarts".
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

RecordT = TypeVar("RecordT")

MAX_STEP_JUMP = 1_000_000  # steps a rank may move ahead at once (about 14 h at 20 steps/s)


class Judgement(enum.Enum):
    CURRENT = "current"  # the instance that speaks for this rank: the record counts
    FIRST = "first"  # the first instance seen for this rank (in this epoch): adopted, the record counts
    STALE = "stale"  # an instance already replaced, or older than the current one: skip
    HELD = "held"  # a restarted rank whose step ids are behind the others': left out
    REJOINED = "rejoined"  # a restarted rank whose step ids reached the others': counts from this record on
    NEW_EPOCH = "new_epoch"  # most ranks restarted: start afresh; this record is the new epoch's first
    IMPLAUSIBLE = "implausible"  # a step id too far ahead: skip (a bad record)

    @property
    def counts(self) -> bool:
        """Whether a record so judged goes into the reader's steps."""
        return self in (Judgement.CURRENT, Judgement.FIRST, Judgement.REJOINED, Judgement.NEW_EPOCH)


def capped_world(rec: RecordT, meta_world: int | None) -> tuple[RecordT, str]:
    """(rec, "") when its world_size is within the run metadata's (or none is known), else (rec with the
    metadata's world_size, why). Raises ValueError for a rank beyond the metadata's world."""
    claimed = int(rec.world_size)  # type: ignore[attr-defined]
    if meta_world is None or claimed <= meta_world:
        return rec, ""
    rank = int(rec.rank)  # type: ignore[attr-defined]
    if rank >= meta_world:
        raise ValueError(f"rank {rank} of {claimed} claimed, the run metadata says {meta_world} ranks")
    why = f"rank {rank} claims {claimed} ranks, the run metadata says {meta_world}: counted as {meta_world}"
    return dataclasses.replace(rec, world_size=meta_world), why  # type: ignore[type-var]


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


class RankInstances:
    """Per run: the instance that speaks for each rank, the retired ones, the restarted ranks held out, and the
    newest step and first record time of each rank's current instance. judge() applies the rule (module doc)
    to one record and updates this state; `why` says, after a judgement other than CURRENT/FIRST, what
    happened in words."""

    def __init__(self, max_retired: int, max_step_jump: int = MAX_STEP_JUMP):
        self.instance_of_rank: dict[int, str] = {}
        self.retired = RetiredInstances(max_retired)
        self.held: set[int] = set()  # restarted ranks whose step ids are behind the others'
        self.newest_step: dict[int, int] = {}  # rank -> newest step of its current instance
        self.started_s: dict[int, float] = {}  # rank -> time of its current instance's first record
        self.max_step_jump = int(max_step_jump)
        self.why = ""

    def restore(self, instance_of_rank: Mapping[int, str], retired: Iterable[str], held: Iterable[int] = ()) -> None:
        """A predecessor's state (newest steps and start times are learnt again from the records)."""
        self.instance_of_rank = {int(r): str(i) for r, i in instance_of_rank.items()}
        self.retired = RetiredInstances(self.retired.max_size, retired)
        self.held = {int(r) for r in held if int(r) in self.instance_of_rank}
        self.newest_step, self.started_s = {}, {}

    def front(self) -> int | None:
        """The slowest live rank's newest step (ranks not held out); None before any. A restarted rank rejoins
        when its step ids reach it."""
        steps = [s for r, s in self.newest_step.items() if r not in self.held]
        return min(steps) if steps else None

    def newest(self) -> int | None:
        """The newest step of any live rank (not held out); None before any."""
        steps = [s for r, s in self.newest_step.items() if r not in self.held]
        return max(steps) if steps else None

    def judge(self, rank: int, instance: str, step: int, time_s: float, world: int) -> Judgement:
        """The rule for one record of `rank`, step `step`, written at `time_s` by collector `instance`, in a run
        of `world` ranks (the reader's best knowledge: the metadata's, else the largest the records claim)."""
        known = self.instance_of_rank.get(rank)
        if known == instance:
            return self._current(rank, step)
        if instance in self.retired:
            self.why = f"rank {rank}: collector instance {instance!r} was replaced"
            return Judgement.STALE
        if self._too_far(step, self.newest()):
            return Judgement.IMPLAUSIBLE
        if known is None:
            self._adopt(rank, instance, step, time_s)
            return Judgement.FIRST
        if time_s < self.started_s.get(rank, float("-inf")):  # an older collector than the one speaking
            self.retired.add(instance)
            self.why = f"rank {rank}: collector instance {instance!r} is older than the current one"
            return Judgement.STALE
        self.retired.add(known)  # this rank restarted: its previous instance only
        self._adopt(rank, instance, step, time_s)
        front = self.front_without(rank)
        if front is not None and step >= front:  # its step ids go on where the others are
            self.held.discard(rank)
            self.why = f"rank {rank}: collector restarted as {instance!r}, its step ids go on ({step})"
            return Judgement.REJOINED
        self.held.add(rank)
        if front is None or len(self.held) * 2 > max(int(world), len(self.instance_of_rank)):
            return self._new_epoch(rank, instance)  # no live rank left to wait for, or most restarted
        self.why = (f"rank {rank}: collector restarted as {instance!r}; its step ids ({step}) are behind the "
                    f"others' ({front}): its records are left out until they catch up or most ranks restart")
        return Judgement.HELD

    def front_without(self, rank: int) -> int | None:
        """front() leaving `rank` out."""
        steps = [s for r, s in self.newest_step.items() if r not in self.held and r != rank]
        return min(steps) if steps else None

    # ------------------------------------------------------------------------------------------- helpers
    def _current(self, rank: int, step: int) -> Judgement:
        newest = self.newest_step.get(rank)
        if self._too_far(step, newest):
            return Judgement.IMPLAUSIBLE
        if newest is None or step > newest:
            self.newest_step[rank] = step
        if rank not in self.held:
            return Judgement.CURRENT
        front = self.front()
        if front is not None and step >= front:
            self.held.discard(rank)
            self.why = f"rank {rank}: its step ids reached the others' ({step}): it counts again"
            return Judgement.REJOINED
        return Judgement.HELD

    def _too_far(self, step: int, newest: int | None) -> bool:
        if newest is None or step - newest <= self.max_step_jump:
            return False
        self.why = f"step {step} is more than {self.max_step_jump} steps beyond the newest ({newest})"
        return True

    def _adopt(self, rank: int, instance: str, step: int, time_s: float) -> None:
        self.instance_of_rank[rank] = instance
        self.newest_step[rank] = step
        self.started_s[rank] = time_s

    def _new_epoch(self, rank: int, instance: str) -> Judgement:
        """Most ranks restarted: the others' instances retire, the restarted ranks make the new epoch."""
        for other, old in list(self.instance_of_rank.items()):
            if other not in self.held:
                self.retired.add(old)
                del self.instance_of_rank[other]
                self.newest_step.pop(other, None)
                self.started_s.pop(other, None)
        restarted = len(self.held)
        self.held.clear()
        self.why = (f"{restarted} ranks restarted (the latest: rank {rank}, as {instance!r}): a new epoch "
                    f"starts afresh")
        return Judgement.NEW_EPOCH

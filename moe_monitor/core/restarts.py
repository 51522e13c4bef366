"""The collector-restart rule, once: RankInstances.judge() says what one per-rank record is under the restarts
seen so far (CURRENT, FIRST, PENDING, HELD, REJOINED, NEW_EPOCH, STALE, IMPLAUSIBLE), and capped_world() counts a
record that claims a larger world than the run metadata's under the metadata's. core.assembly.Assembler applies
it, in the aggregator and in the dashboard's reader alike. Pure: no I/O, no clock of its own (record times are the
collectors', arrival times the caller's). The rule in words: docs/scaling.md, "Collector restarts".
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

RecordT = TypeVar("RecordT")

MAX_STEP_JUMP = 1_000_000  # steps a rank may move ahead at once (about 14 h at 20 steps/s)
SILENCE_S = 2.0  # an instance whose records stop arriving this long (or SILENCE_GAPS of its own pace) is gone
SILENCE_GAPS = 4  # ... a slow writer (a training step of 10 s) is gone after this many of its own gaps


class Judgement(enum.Enum):
    CURRENT = "current"  # the instance that speaks for this rank: the record counts
    FIRST = "first"  # the first instance seen for this rank (in this epoch): adopted, the record counts
    PENDING = "pending"  # a new instance while the rank's current one still writes: held until that one stops
    STALE = "stale"  # an instance already replaced, or older than the current one: skip
    HELD = "held"  # a restarted rank whose step ids are behind the others': left out
    REJOINED = "rejoined"  # a restarted rank whose step ids reached the others': counts from this record on
    NEW_EPOCH = "new_epoch"  # most ranks restarted, the others stopped: start afresh with this record
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

    def discard(self, instance: str) -> None:
        self._order.pop(instance, None)

    def __contains__(self, instance: object) -> bool:
        return instance in self._order

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)


@dataclass
class Writer:
    """What is known of one collector instance's records for its rank: step ids (first, newest), record times
    (first, newest: the collectors' clock), its pace (the latest gap between two newer steps), when its latest
    record arrived (the caller's clock), and whether its conflict with another instance was said."""

    instance: str
    first_step: int
    newest_step: int
    started_s: float
    newest_s: float
    seen_s: float
    gap_s: float = 0.0
    said: bool = False

    def saw(self, step: int, time_s: float, now_s: float) -> None:
        if step > self.newest_step:
            if time_s > self.newest_s:
                self.gap_s = time_s - self.newest_s
            self.newest_step = step
        self.newest_s = max(self.newest_s, time_s)
        self.seen_s = max(self.seen_s, now_s)

    def silent(self, time_s: float, now_s: float, silence_s: float) -> bool:
        """Whether nothing of it came for its silence span before a record of time_s arriving at now_s."""
        span = max(silence_s, SILENCE_GAPS * self.gap_s)
        return time_s - self.newest_s >= span or now_s - self.seen_s >= span


@dataclass
class _Before:
    """The rule's state just before the latest new epoch (to undo it), the instances that epoch retired, and
    those retired before it (one of them writing newer steps undoes it too)."""

    instance_of_rank: dict[int, str]
    writers: dict[int, Writer]
    challengers: dict[int, Writer]
    held: set[int]
    retired_now: set[str]
    retired_then: set[str]


class RankInstances:
    """Per run: the instance that speaks for each rank (and a Writer of what its records showed), the new
    instances waiting to replace one (challengers), the retired ones, the restarted ranks held out. judge()
    applies the rule (docs/scaling.md) to one record and updates this state; after it, `why` says what happened
    in words, `promoted` names an instance that has just replaced its rank's (its waiting records go back in),
    `dropped` lists challengers given up (their waiting records go), `undone` says a new epoch was undone and
    `conflict` that two live instances of one rank were seen (said once per instance)."""

    def __init__(self, max_retired: int, max_step_jump: int = MAX_STEP_JUMP, silence_s: float = SILENCE_S):
        self.instance_of_rank: dict[int, str] = {}
        self.writers: dict[int, Writer] = {}  # rank -> its current instance's records
        self.challengers: dict[int, Writer] = {}  # rank -> a new instance waiting while the current one writes
        self.retired = RetiredInstances(max_retired)
        # retired instance -> (its rank, its newest step and record time then, the record time and arrival of the
        # record that retired it): a newer step written after that, or arriving well after it, says it still writes
        self.retired_from: dict[str, tuple[int, int, float, float, float]] = {}
        self.held: set[int] = set()  # restarted ranks whose step ids are behind the others'
        self.max_step_jump = int(max_step_jump)
        self.silence_s = float(silence_s)
        self.why = ""
        self.promoted: str | None = None
        self.dropped: list[str] = []
        self.undone = False
        self.conflict = False
        self._before: _Before | None = None
        self._stopped: tuple | None = None  # (time_s, now_s, held, ranks: the look's key; answer) of the last look
        self._at = (0.0, 0.0)  # (time_s, now_s) of the record being judged

    def restore(self, instance_of_rank: Mapping[int, str], retired: Iterable[str], held: Iterable[int] = ()) -> None:
        """A predecessor's state (what the records showed is learnt again from the records)."""
        self.instance_of_rank = {int(r): str(i) for r, i in instance_of_rank.items()}
        self.retired = RetiredInstances(self.retired.max_size, retired)
        self.held = {int(r) for r in held if int(r) in self.instance_of_rank}
        self.writers, self.challengers, self.retired_from = {}, {}, {}
        self._before = None

    @property
    def newest_step(self) -> dict[int, int]:
        """rank -> the newest step of its current instance (ranks seen since this state was made or restored)."""
        return {r: w.newest_step for r, w in self.writers.items()}

    def front(self) -> int | None:
        """The slowest live rank's newest step (ranks not held out); None before any. A restarted rank rejoins
        when its step ids reach it."""
        return self.front_without(-1)

    def front_without(self, rank: int) -> int | None:
        """front() leaving `rank` out."""
        steps = [w.newest_step for r, w in self.writers.items() if r not in self.held and r != rank]
        return min(steps) if steps else None

    def newest(self) -> int | None:
        """The newest step of any live rank (not held out); None before any."""
        steps = [w.newest_step for r, w in self.writers.items() if r not in self.held]
        return max(steps) if steps else None

    def judge(self, rank: int, instance: str, step: int, time_s: float, world: int, now_s: float = 0.0) -> Judgement:
        """The rule for one record of `rank`, step `step`, written at `time_s` by collector `instance`, arriving
        at now_s (the caller's monotonic clock), in a run of `world` ranks (the reader's best knowledge: the
        metadata's, else the largest the records claim)."""
        self.promoted, self.undone, self.conflict = None, False, False
        self._at = (time_s, now_s)
        known = self.instance_of_rank.get(rank)
        if known == instance:
            return self._current(rank, step, time_s, world, now_s)
        came_back = False
        if instance in self.retired:
            was = self.retired_from.get(instance)
            if was is None or was[0] != rank or step <= was[1] or time_s <= was[2] or (
                    time_s < was[3] and now_s - was[4] < self.silence_s):  # a late record, not a new one
                self.why = f"rank {rank}: collector instance {instance!r} was replaced"
                return Judgement.STALE
            before = self._before
            if before is not None and (instance in before.retired_now or instance in before.retired_then):
                said = self._undo(rank, instance, step, time_s, world, now_s)
                return said
            self.retired.discard(instance)  # it writes newer steps than when it was replaced: it is alive
            del self.retired_from[instance]
            came_back = True
        if self._too_far(step, self.newest()):
            return Judgement.IMPLAUSIBLE
        if known is None:
            self._adopt(rank, Writer(instance, step, step, time_s, time_s, now_s))
            return Judgement.FIRST
        current = self._writer_of(rank, known, step, time_s, now_s)
        waiting = self.challengers.get(rank)
        if waiting is None or waiting.instance != instance:
            if time_s < current.started_s and not came_back:  # an older collector than the one speaking
                self._retire(instance, rank, step, time_s)
                self.why = f"rank {rank}: collector instance {instance!r} is older than the current one"
                return Judgement.STALE
            if waiting is not None:
                self._drop(rank)
            waiting = self.challengers[rank] = Writer(instance, step, step, time_s, time_s, now_s)
        else:
            waiting.saw(step, time_s, now_s)
        if step > current.newest_step:
            return self._promote(rank, "its step ids passed the old one's", step, time_s, world, now_s)
        if current.silent(time_s, now_s, self.silence_s):
            return self._promote(rank, "the old one stopped writing", step, time_s, world, now_s)
        if came_back and not waiting.said:
            waiting.said = self.conflict = True
        self.why = (f"rank {rank}: collector instance {instance!r} writes while {known!r} still does: its records "
                    f"wait until {known!r} stops or {instance!r}'s step ids pass it")
        return Judgement.PENDING

    # ------------------------------------------------------------------------------------------- helpers
    def _current(self, rank: int, step: int, time_s: float, world: int, now_s: float) -> Judgement:
        writer = self._writer_of(rank, self.instance_of_rank[rank], step, time_s, now_s)
        if self._too_far(step, writer.newest_step):
            return Judgement.IMPLAUSIBLE
        writer.saw(step, time_s, now_s)
        if self.challengers:
            self._check_waiting(rank, time_s, now_s)
        if rank not in self.held:
            return Judgement.CURRENT
        front = self.front()
        if front is not None and step >= front:
            self.held.discard(rank)
            self.why = f"rank {rank}: its step ids reached the others' ({step}): it counts again"
            return Judgement.REJOINED
        if front is None or self._most_restarted(world, time_s, now_s):
            return self._new_epoch(rank, self.instance_of_rank[rank])
        return Judgement.HELD

    def _check_waiting(self, rank: int, time_s: float, now_s: float) -> None:
        """The current instance of `rank` wrote: a challenger waiting for it is a conflict (said once), and one
        that stopped writing is given up."""
        waiting = self.challengers.get(rank)
        if waiting is None:
            return
        if waiting.silent(time_s, now_s, self.silence_s):
            self._drop(rank)
        elif not waiting.said:
            waiting.said = self.conflict = True
            self.why = (f"rank {rank}: collector instances {self.instance_of_rank[rank]!r} and {waiting.instance!r} "
                        f"both write; {self.instance_of_rank[rank]!r} counts until it stops or the other's step ids "
                        "pass it")

    def _writer_of(self, rank: int, instance: str, step: int, time_s: float, now_s: float) -> Writer:
        """The current instance's Writer; one learnt from this record when none is known (a restored state): it
        neither looks stopped nor passed until the records say so."""
        writer = self.writers.get(rank)
        if writer is None:
            writer = self.writers[rank] = Writer(instance, step, step, float("-inf"), time_s, now_s)
        return writer

    def _too_far(self, step: int, newest: int | None) -> bool:
        if newest is None or step - newest <= self.max_step_jump:
            return False
        self.why = f"step {step} is more than {self.max_step_jump} steps beyond the newest ({newest})"
        return True

    def _adopt(self, rank: int, writer: Writer) -> None:
        self.instance_of_rank[rank] = writer.instance
        self.writers[rank] = writer
        self.challengers.pop(rank, None)

    def _retire(self, instance: str, rank: int, newest_step: int, newest_s: float) -> None:
        self.retired.add(instance)
        self.retired_from[instance] = (rank, newest_step, newest_s, *self._at)
        while len(self.retired_from) > self.retired.max_size:
            del self.retired_from[next(iter(self.retired_from))]

    def _drop(self, rank: int) -> None:
        """Give up the challenger of `rank` (retired: a newer step of it later makes it a challenger again)."""
        waiting = self.challengers.pop(rank)
        self._retire(waiting.instance, rank, waiting.newest_step, waiting.newest_s)
        self.dropped.append(waiting.instance)

    def _promote(self, rank: int, how: str, step: int, time_s: float, world: int, now_s: float) -> Judgement:
        """The challenger of `rank` replaces its current instance (retired)."""
        old = self.writers[rank]
        self._retire(old.instance, rank, old.newest_step, old.newest_s)
        waiting = self.challengers[rank]
        self._adopt(rank, waiting)
        self.promoted = waiting.instance
        front = self.front_without(rank)
        if front is not None and step >= front:  # its step ids go on where the others are
            self.held.discard(rank)
            self.why = f"rank {rank}: collector restarted as {waiting.instance!r} ({how}), its step ids go on ({step})"
            return Judgement.REJOINED
        self.held.add(rank)
        if front is None or self._most_restarted(world, time_s, now_s):
            return self._new_epoch(rank, waiting.instance)
        self.why = (f"rank {rank}: collector restarted as {waiting.instance!r} ({how}); its step ids ({step}) are "
                    f"behind the others' ({front}): its records are left out until they catch up or most ranks "
                    "restart")
        return Judgement.HELD

    def _most_restarted(self, world: int, time_s: float, now_s: float) -> bool:
        """Most ranks restarted (more than half the world) and every other rank's instance stopped writing."""
        if len(self.held) * 2 <= max(int(world), len(self.instance_of_rank)):
            return False
        key = (time_s, now_s, len(self.held), len(self.instance_of_rank))  # a rank held since: look again
        if self._stopped is not None and self._stopped[0] == key:
            return self._stopped[1]
        answer = True
        for rank, instance in self.instance_of_rank.items():
            if rank not in self.held and not self._writer_of(rank, instance, -1, time_s, now_s).silent(
                    time_s, now_s, self.silence_s):
                answer = False
                break
        self._stopped = (key, answer)
        return answer

    def _new_epoch(self, rank: int, instance: str) -> Judgement:
        """Most ranks restarted and the others stopped: the others' instances retire (a challenger waiting for
        one takes its rank), the restarted ranks make the new epoch. The state before is kept to undo it."""
        before = _Before(dict(self.instance_of_rank), dict(self.writers), dict(self.challengers), set(self.held),
                         set(), set(self.retired_from))
        for other, old in list(self.instance_of_rank.items()):
            if other in self.held:
                continue
            writer = self.writers.pop(other, None)
            self._retire(old, other, -1 if writer is None else writer.newest_step,
                         float("inf") if writer is None else writer.newest_s)
            before.retired_now.add(old)
            del self.instance_of_rank[other]
            waiting = self.challengers.get(other)
            if waiting is not None:
                self._adopt(other, waiting)
        restarted = len(self.held)
        self.held.clear()
        self._before = before
        self.why = (f"{restarted} ranks restarted and the others stopped (the latest: rank {rank}, as {instance!r}): "
                    "a new epoch starts afresh")
        return Judgement.NEW_EPOCH

    def _undo(self, rank: int, instance: str, step: int, time_s: float, world: int, now_s: float) -> Judgement:
        """An instance the latest new epoch retired writes newer steps: that epoch is undone (the state before it
        comes back; the instances the epoch adopted wait as challengers), then the record is judged again."""
        before = self._before
        assert before is not None
        self._before = None
        epoch_map, epoch_writers = self.instance_of_rank, self.writers
        for old in before.retired_now:
            self.retired.discard(old)
            self.retired_from.pop(old, None)
        self.instance_of_rank, self.writers = before.instance_of_rank, before.writers
        self.challengers, self.held = before.challengers, before.held
        for other, adopted in epoch_map.items():
            if self.instance_of_rank.get(other) != adopted and other in epoch_writers:
                self.challengers[other] = epoch_writers[other]
                self.challengers[other].said = True
        said = self.judge(rank, instance, step, time_s, world, now_s)
        self.undone = self.conflict = True
        self.why = (f"rank {rank}: collector instance {instance!r} still writes (step {step}) after a new epoch "
                    f"retired it: the new epoch is undone")
        return said

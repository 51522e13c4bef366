"""Assembly of rank records into steps (core.AggregateRecord): the one place a step's ranks are summed and
collector restarts judged. `moe-monitor aggregate` runs it over a run's stream; the dashboard's reader runs it
in-process when no aggregator does. Pure: no I/O, no clock of its own (callers pass the monotonic arrival time).

Assembler.add() folds (entry id, StepRecord) pairs into steps and returns Output: the assembled steps with the
entries each consumed, and the entries consumed without one (duplicates, stale, too old, bad), so every entry
handed in comes back exactly once. The rules (deadline, late ranks, duplicates, restarts and epochs, world claims):
docs/scaling.md, "How a step is assembled".

Shape legend: L MoE layers, E logical experts, R ranks of a record.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .aggregates import AggregateRecord
from .keys import check_run_name
from .membudget import MemoryBudget, format_bytes
from .restarts import Judgement, RankInstances, RetiredInstances, capped_world
from .steps import StepRecord

MAX_RETIRED = 1024  # retired collector instances remembered (the oldest forgotten first)
MAX_HELD = 4096  # records of restarted ranks held while their step ids are behind the others'
MAX_NAMED = 16  # missing ranks named in a message
_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass
class Counters:
    """What the aggregator did for a run, cumulative (kept in the progress hash across takeovers).

    steps_written: aggregated steps written (late entries not included); rank_steps_missing: ranks absent
    from the steps written without them; late_records / late_ranks: late entries written and the ranks they
    folded in; duplicates: (step, rank) records seen again; bad_records: entries that do not decode or do not
    fit their epoch; stale_records: records of retired collector instances; too_old: ranks of forgotten steps;
    epochs: epochs opened (1 for a run whose collectors never restarted); rank_restarts: collector restarts of
    single ranks; held_records: records of restarted ranks given up (their step ids never met the others');
    world_claims: records claiming more ranks than the run metadata (counted under its world, or skipped when
    their rank is beyond it); implausible_steps: step ids far beyond their rank's newest; instance_conflicts:
    two live collector instances of one rank (each said once); epochs_undone: new epochs undone because an
    instance they retired kept writing; budget_writes: steps written before their deadline to stay within the
    memory budget; over_budget: records skipped because not even one step of their shape fits the budget."""

    steps_written: int = 0
    rank_steps_missing: int = 0
    late_records: int = 0
    late_ranks: int = 0
    duplicates: int = 0
    bad_records: int = 0
    stale_records: int = 0
    too_old: int = 0
    epochs: int = 0
    rank_restarts: int = 0
    held_records: int = 0
    world_claims: int = 0
    implausible_steps: int = 0
    instance_conflicts: int = 0
    epochs_undone: int = 0
    budget_writes: int = 0
    over_budget: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, int]) -> Counters:
        """Counters from a mapping of some of the field names (others 0; unknown names ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: int(v) for k, v in values.items() if k in names})


@dataclass(frozen=True)
class Emitted:
    """An aggregate to write, and the stream entries it consumed (to XACK with it)."""

    record: AggregateRecord
    entry_ids: tuple[bytes, ...]


@dataclass
class Output:
    """What a call produced: aggregates to write (in order) and entries consumed without one."""

    emitted: list[Emitted] = field(default_factory=list)
    acks: list[bytes] = field(default_factory=list)

    def extend(self, other: Output) -> None:
        self.emitted.extend(other.emitted)
        self.acks.extend(other.acks)

    def __bool__(self) -> bool:
        return bool(self.emitted or self.acks)


class _Bucket:
    """One step's ranks being summed; ranks: rank -> (tokens, dropped steps).

    Records are added into an int32 staging array [L, E] (a third of the memory traffic of an int64 add) while
    the sum of their maxima stays within int32; before that could overflow the stage is folded into the int64
    total. counts_LE() gives the exact int64 [L, E] sum."""

    __slots__ = ("step", "first_seen_s", "world", "_total_LE", "_stage_LE", "_stage_bound", "ranks", "time_s",
                 "phases", "scopes", "entry_ids", "rows")

    def __init__(self, rec: StepRecord, entry_id: bytes, now_s: float, rows: int = 0):
        self.rows = rows  # rows of the memory budget it holds (0: a late bucket, a temporary of one call)
        self.step = rec.step
        self.first_seen_s = now_s
        self.world = rec.world_size
        self._total_LE: np.ndarray | None = None
        self._stage_LE = np.array(rec.counts_LE, dtype=np.int32)  # a copy: v1 records are read-only views
        self._stage_bound = int(self._stage_LE.max(initial=0))
        self.ranks = {rec.rank: (rec.tokens, rec.dropped_steps)}
        self.time_s = rec.time_s
        self.phases = {rec.phase}
        self.scopes = {rec.scope}
        self.entry_ids = [entry_id]

    def add(self, rec: StepRecord, entry_id: bytes) -> None:
        counts = rec.counts_LE
        top = int(counts.max(initial=0))
        if self._stage_bound + top > _INT32_MAX:
            self._fold()
        if top > _INT32_MAX:  # not from the wire (int32 there): straight into the int64 total
            self._total_LE = self._total_LE + counts if self._total_LE is not None else counts.astype(np.int64)
        else:
            np.add(self._stage_LE, counts, out=self._stage_LE, casting="unsafe")
            self._stage_bound += top
        self.ranks[rec.rank] = (rec.tokens, rec.dropped_steps)
        self.world = max(self.world, rec.world_size)
        self.time_s = max(self.time_s, rec.time_s)
        self.phases.add(rec.phase)
        self.scopes.add(rec.scope)
        self.entry_ids.append(entry_id)

    def folds(self, rec: StepRecord) -> bool:
        """Whether adding rec makes the int64 total of this step exist (it did not before)."""
        return self._total_LE is None and (
            self._stage_bound + int(rec.counts_LE.max(initial=0)) > _INT32_MAX)

    def _fold(self) -> None:
        if self._total_LE is None:
            self._total_LE = self._stage_LE.astype(np.int64)
        else:
            np.add(self._total_LE, self._stage_LE, out=self._total_LE)
        self._stage_LE[...] = 0
        self._stage_bound = 0

    def counts_LE(self) -> np.ndarray:
        """int64 [L, E]: the exact sum of the records added."""
        if self._total_LE is None:
            return self._stage_LE.astype(np.int64)
        return self._total_LE + self._stage_LE


class Assembler:
    """Sums the ranks of each step of one run (see the module docstring for the rules).

    State a successor needs (restore() takes it back): the epoch, its collector instance of each rank, the
    retired instances, the ranks written of each remembered step (`written`: step -> bit mask of ranks, in
    write order) and the counters."""

    def __init__(self, run: str, deadline_s: float = 2.0, max_pending_steps: int = 4096,
                 remember_steps: int = 16_384, budget: MemoryBudget | None = None):
        self.run = check_run_name(run)
        self.deadline_s = float(deadline_s)
        self.max_pending_steps = int(max_pending_steps)
        self.remember_steps = int(remember_steps)
        self.epoch: str | None = None
        self.instances = RankInstances(MAX_RETIRED)  # the restart rule's state (core.restarts)
        self.meta_world: int | None = None  # the run metadata's world size (set by the reader), when known
        self._epoch_world = 1  # the largest world a record of this epoch claimed
        self._held: dict[bytes, StepRecord] = {}  # entries of held ranks, oldest first (at most MAX_HELD)
        self.written: dict[int, int] = {}  # step -> mask of the ranks written, in write order
        self.horizon = 0  # steps below it that are neither pending nor written are too old
        self.last_step = -1
        self.shape: tuple[int, int] | None = None
        self.counters = Counters()
        self.version = 0  # goes up whenever the epoch, the instance map or the retired set changes
        self.last_missing: tuple[int, list[int]] | None = None  # (step, ranks) of the latest step written short
        self.last_problem = ""  # why the latest record was skipped (bad, stale, too old)
        self._pending: dict[int, _Bucket] = {}  # step -> bucket, in arrival order
        self._before: tuple | None = None  # the epoch before the latest new one (to undo it)
        # memory: a row is one int32 [L, E] (a pending step's stage, a held record; a step with an int64 total
        # holds 3); rows are reserved from `budget`, at most max_rows of them (size_for())
        self.budget = budget
        self._reservation = budget.try_reserve(0) if budget is not None else None
        self.max_rows: int | None = None
        self.budget_problem = ""  # the latest step written early or record skipped for the budget
        self.share_bytes: int | None = None  # this run's share of the budget (set by the aggregator)
        self._row_bytes = 0
        self._rows = 0

    # --------------------------------------------------------------------------------------------- state
    @property
    def instance_of_rank(self) -> dict[int, str]:
        """rank -> the collector instance that speaks for it in this epoch."""
        return self.instances.instance_of_rank

    @property
    def retired(self) -> RetiredInstances:
        return self.instances.retired

    @property
    def held_ranks(self) -> list[int]:
        """Restarted ranks whose step ids are behind the others' (their records held out), ascending."""
        return sorted(self.instances.held)

    def restore(self, epoch: str | None, instance_of_rank: Mapping[int, str], retired: Iterable[str],
                written: Mapping[int, int], horizon: int, counters: Counters, held: Iterable[int] = ()) -> None:
        """Take over a predecessor's state (nothing may be pending here yet). written: step -> rank mask of
        the epoch's steps known to be written; horizon: steps below it are treated as too old; held: the
        restarted ranks held out."""
        if self._pending or self._held:
            raise ValueError("restore() needs an assembler with nothing pending")
        self.epoch = epoch
        self.instances.restore(instance_of_rank, retired, held)
        self.written = {int(s): int(m) for s, m in sorted(written.items())}
        self.horizon = int(horizon)
        self.last_step = max(self.written, default=-1)
        self.counters = counters
        self.shape = None
        self._before = None
        self.version += 1

    @property
    def held_count(self) -> int:
        """Records of restarted ranks held now (not yet placed into a new epoch nor given up)."""
        return len(self._held)

    @property
    def pending_steps(self) -> int:
        return len(self._pending)

    def held_entry_ids(self) -> set[bytes]:
        """The stream entry ids this assembler holds (in pending steps and held ranks), not yet handed back."""
        held = set(self._held)
        for bucket in self._pending.values():
            held.update(bucket.entry_ids)
        return held

    def oldest_pending_id(self) -> bytes | None:
        """The smallest stream entry id held by a pending step or a held rank (None when nothing is)."""
        firsts = [b.entry_ids[0] for b in self._pending.values()] + list(self._held)[:1]
        return min(firsts, key=entry_id_key) if firsts else None

    def oldest_pending_time_s(self) -> float:
        """The earliest time (the collectors' clock) of a step still assembling; inf when none is."""
        return min((b.time_s for b in self._pending.values()), default=math.inf)

    def next_deadline_s(self, now_s: float) -> float | None:
        """Seconds until the oldest pending step's deadline (None when nothing is pending)."""
        for bucket in self._pending.values():
            return max(0.0, bucket.first_seen_s + self.deadline_s - now_s)
        return None

    # --------------------------------------------------------------------------------------------- input
    def add(self, entries: Sequence[tuple[bytes, StepRecord]], now_s: float) -> Output:
        """Fold decoded stream entries (entry id, record), in stream order, into their steps; returns the
        steps they completed, the late entries they make and the entries consumed without a record."""
        out = Output()
        late: dict[int, _Bucket] = {}
        touched: dict[int, _Bucket] = {}
        for entry_id, rec in entries:
            self._place(entry_id, rec, now_s, out, late, touched)
        for step in sorted(touched):
            bucket = touched[step]
            if len(bucket.ranks) >= bucket.world and self._pending.get(step) is bucket:
                del self._pending[step]
                out.emitted.append(self._emit(bucket, late=False))
        for step in sorted(late):
            out.emitted.append(self._emit(late[step], late=True))
        while len(self._pending) > self.max_pending_steps:  # the oldest goes with what it has
            step = next(iter(self._pending))
            out.emitted.append(self._emit(self._pending.pop(step), late=False))
        return out

    def bad(self, entry_id: bytes, why: str) -> Output:
        """An entry that did not decode: counted, consumed without a record."""
        self.counters.bad_records += 1
        self.last_problem = why
        return Output(acks=[entry_id])

    def due(self, now_s: float) -> Output:
        """The pending steps whose deadline passed, written with the ranks they have (ascending by step)."""
        ready: list[_Bucket] = []
        for bucket in self._pending.values():  # arrival order: the first not due ends the search
            if now_s - bucket.first_seen_s < self.deadline_s:
                break
            ready.append(bucket)
        out = Output()
        for bucket in sorted(ready, key=lambda b: b.step):
            del self._pending[bucket.step]
            out.emitted.append(self._emit(bucket, late=False))
        return out

    # --------------------------------------------------------------------------------------------- rules
    def _place(self, entry_id: bytes, rec: StepRecord, now_s: float, out: Output,
               late: dict[int, _Bucket], touched: dict[int, _Bucket]) -> None:
        try:
            rec, claim = capped_world(rec, self.meta_world)
        except ValueError as exc:
            self.counters.world_claims += 1
            self._skip(entry_id, out, f"step {rec.step}: {exc}")
            return
        if claim:
            self.counters.world_claims += 1
            self.last_problem = f"step {rec.step}: {claim}"
        if not self._current(entry_id, rec, now_s, out, late, touched):
            return
        shape = rec.counts_LE.shape
        if self.shape is None:
            self.shape = (int(shape[0]), int(shape[1]))
        elif shape != self.shape:
            self.counters.bad_records += 1
            self.last_problem = (f"step {rec.step} rank {rec.rank}: counts are {list(shape)}, this epoch's are "
                                 f"{list(self.shape)}")
            out.acks.append(entry_id)
            return
        step, rank = rec.step, rec.rank
        mask = self.written.get(step)
        if mask is not None:  # written already: a duplicate, or a late rank
            group = late.get(step)
            if mask >> rank & 1 or (group is not None and rank in group.ranks):
                self._duplicate(entry_id, out)
            elif group is None:
                late[step] = _Bucket(rec, entry_id, now_s)
            else:
                group.add(rec, entry_id)
            return
        bucket = self._pending.get(step)
        if bucket is None:
            if step < self.horizon:
                self.counters.too_old += 1
                self.last_problem = f"step {step} rank {rank}: older than every step remembered (from {self.horizon})"
                out.acks.append(entry_id)
                return
            if self._row_bytes < rec.counts_LE.size * 4:  # a shape larger than the metadata's: sized again
                self.size_for(*rec.counts_LE.shape)
            if not self._reserve(1, out):
                self._refuse(entry_id, rec, out)
                return
            bucket = self._pending[step] = _Bucket(rec, entry_id, now_s, rows=1)
        elif rank in bucket.ranks:
            self._duplicate(entry_id, out)
            return
        else:
            if bucket.folds(rec):  # its int64 total: two rows more, others written early if they do not fit
                self._rows += 2
                bucket.rows += 2
                while not self._fits(self._rows) and self._free_oldest(out, keep=bucket):
                    pass
            bucket.add(rec, entry_id)
        touched[step] = bucket

    def _duplicate(self, entry_id: bytes, out: Output) -> None:
        self.counters.duplicates += 1
        out.acks.append(entry_id)

    def _current(self, entry_id: bytes, rec: StepRecord, now_s: float, out: Output,
                 late: dict[int, _Bucket], touched: dict[int, _Bucket]) -> bool:
        """True when rec goes on into its step under the current epoch (the restart rule, core.restarts: a
        new epoch is opened or undone here); otherwise rec is consumed here (held, or acked and counted)."""
        self._epoch_world = max(self._epoch_world, int(rec.world_size))
        rule = self.instances
        said = rule.judge(rec.rank, rec.instance, rec.step, rec.time_s, self.meta_world or self._epoch_world, now_s)
        if said is Judgement.CURRENT and not (rule.dropped or rule.conflict):
            return True
        self.version += 1
        if rule.undone:
            self._undo_epoch(out, late, touched)
        if rule.conflict:
            self.counters.instance_conflicts += 1
            self.last_problem = rule.why
        if rule.dropped:
            dropped, rule.dropped = set(rule.dropped), []
            self._give_up_held(lambda r: r.instance in dropped, out)
        if rule.promoted is not None:
            self.counters.rank_restarts += 1
            self.last_problem = rule.why
        promoted = rule.promoted
        goes_on = False
        if said is Judgement.CURRENT:
            goes_on = True
        elif said is Judgement.STALE:
            self.counters.stale_records += 1
            self._skip(entry_id, out, f"step {rec.step} {rule.why}")
        elif said is Judgement.IMPLAUSIBLE:
            self.counters.implausible_steps += 1
            self._skip(entry_id, out, f"rank {rec.rank}: {rule.why}")
        elif said is Judgement.PENDING:
            if not rule.conflict:
                self.last_problem = rule.why
            self._hold(entry_id, rec, out)
        elif said is Judgement.HELD:
            self._hold(entry_id, rec, out)
        elif said is Judgement.REJOINED:
            self.last_problem = rule.why
            if promoted is None:  # a held rank caught up: its held records of steps still assembling go in, the
                lowest = min(self._pending, default=rec.step)  # older ones are of steps long gone by
                self._give_up_held(lambda r, rank=rec.rank: r.rank == rank and r.step < lowest, out)
                self._place_held(lambda r, rank=rec.rank: r.rank == rank, now_s, out, late, touched)
            goes_on = True
        elif said is Judgement.NEW_EPOCH:
            self._new_epoch(rec.instance, out, late, touched)
            self.last_problem = rule.why
            promoted = None  # every held record whose instance now speaks goes in below
            self._place_held(lambda r: rule.instance_of_rank.get(r.rank) == r.instance, now_s, out, late, touched,
                             give_up_others=True)
            goes_on = True
        elif self.epoch is None:  # FIRST, the run's first epoch
            self.epoch = rec.instance
            self.counters.epochs += 1
            goes_on = True
        else:
            goes_on = True
        if promoted is not None:  # a challenger took its rank: the records it wrote while waiting go back in
            self._place_held(lambda r: r.instance == promoted, now_s, out, late, touched)
        return goes_on

    def _place_held(self, which, now_s: float, out: Output, late: dict[int, _Bucket], touched: dict[int, _Bucket],
                    give_up_others: bool = False) -> None:
        """Place the held records `which` picks again (in arrival order); give_up_others: the rest are given up."""
        held = list(self._held.items())
        for held_id, _rec in held:
            del self._held[held_id]
        for held_id, held_rec in held:
            self._unreserve(1)
            if which(held_rec):
                self._place(held_id, held_rec, now_s, out, late, touched)
            elif give_up_others:
                self.counters.held_records += 1
                out.acks.append(held_id)
            else:
                self._hold(held_id, held_rec, out)

    def _skip(self, entry_id: bytes, out: Output, why: str) -> None:
        out.acks.append(entry_id)
        self.last_problem = why

    def _hold(self, entry_id: bytes, rec: StepRecord, out: Output) -> None:
        """Keep a record (un-acked) of a restarted rank or of an instance waiting to replace one; the oldest held
        beyond MAX_HELD, or beyond what the memory budget holds, is given up (counted)."""
        while len(self._held) >= MAX_HELD or (self._held and not self._reserve(1, out, free_pending=False)):
            oldest = next(iter(self._held))
            del self._held[oldest]
            self._unreserve(1)
            self.counters.held_records += 1
            out.acks.append(oldest)
        if not self._held and not self._reserve(1, out):
            self._refuse(entry_id, rec, out)
            return
        self._held[entry_id] = rec

    def _give_up_held(self, which, out: Output) -> None:
        """The held records `which` picks are consumed without a record (counted)."""
        for held_id in [i for i, r in self._held.items() if which(r)]:
            del self._held[held_id]
            self._unreserve(1)
            self.counters.held_records += 1
            out.acks.append(held_id)

    def _flush(self, out: Output, late: dict[int, _Bucket], touched: dict[int, _Bucket]) -> None:
        """Write what the epoch has pending (steps, then late ranks)."""
        for bucket in sorted(self._pending.values(), key=lambda b: b.step):
            out.emitted.append(self._emit(bucket, late=False))
        for step in sorted(late):
            out.emitted.append(self._emit(late[step], late=True))
        self._pending.clear()
        late.clear()
        touched.clear()

    def _new_epoch(self, instance: str, out: Output, late: dict[int, _Bucket], touched: dict[int, _Bucket]) -> None:
        """Write what the old epoch has pending and start afresh under `instance` (the rule already retired the
        old epoch's collector instances); the old epoch's state is kept should the new one be undone."""
        self._flush(out, late, touched)
        was_retired = self.epoch is None or self.epoch in self.retired
        self._before = (self.epoch, self.written, self.horizon, self.last_step, self.shape, self._epoch_world,
                        was_retired)
        if self.epoch is not None:
            self.retired.add(self.epoch)
        self.written, self.horizon, self.last_step, self.shape = {}, 0, -1, None
        self._epoch_world = 1
        self.epoch = instance
        self.counters.epochs += 1

    def _undo_epoch(self, out: Output, late: dict[int, _Bucket], touched: dict[int, _Bucket]) -> None:
        """The rule undid the latest new epoch (an instance it retired writes newer steps): what the undone epoch
        has pending is written under it, and the epoch before goes on where it was."""
        self._flush(out, late, touched)
        if self._before is None:  # restored since (a takeover): the rule's state alone goes back
            return
        epoch, self.written, self.horizon, self.last_step, self.shape, self._epoch_world, was_retired = self._before
        self._before = None
        if epoch is not None and not was_retired:
            self.retired.discard(epoch)
        self.epoch = epoch
        self.counters.epochs_undone += 1

    # --------------------------------------------------------------------------------------------- memory
    def size_for(self, num_layers: int, num_experts: int) -> int:
        """Size this run's rows for counts [num_layers, num_experts] (the run metadata's, at start) within
        share_bytes (None: the budget's own bound only): pending steps and held records together at most
        max_pending_steps + MAX_HELD, at most share_bytes of them. Returns the rows granted (0: not one step
        fits; its records are then skipped, counted as over_budget, with one message)."""
        self._row_bytes = max(self._row_bytes, int(num_layers) * int(num_experts) * 4, 1)
        return self.resize()

    def resize(self) -> int:
        """size_for() again under the current share_bytes (the shape as known); returns the rows granted."""
        cap = self.max_pending_steps + MAX_HELD
        if self.share_bytes is not None and self._row_bytes:
            cap = min(cap, int(self.share_bytes) // self._row_bytes)
        self.max_rows = cap
        return cap

    def _fits(self, rows: int) -> bool:
        if self.max_rows is not None and rows > self.max_rows:
            return False
        return self._reservation is None or self._reservation.resize_to(rows * self._row_bytes)

    def _reserve(self, rows: int, out: Output, free_pending: bool = True, keep: _Bucket | None = None) -> bool:
        """Take rows for a new step or a held record; when they do not fit, the oldest pending steps are written
        early with what they have (free_pending). False when they still do not fit."""
        while not self._fits(self._rows + rows):
            if not free_pending or not self._free_oldest(out, keep):
                return False
        self._rows += rows
        return True

    def _unreserve(self, rows: int) -> None:
        self._rows = max(0, self._rows - rows)
        if self._reservation is not None and self._reservation.nbytes > self._rows * self._row_bytes:
            self._reservation.resize_to(self._rows * self._row_bytes)

    def _free_oldest(self, out: Output, keep: _Bucket | None = None) -> bool:
        """Write the oldest pending step (by arrival; not `keep`) with the ranks it has; False when none is."""
        for step, bucket in self._pending.items():
            if bucket is not keep:
                del self._pending[step]
                out.emitted.append(self._emit(bucket, late=False))
                self.budget_problem = (f"step {step} written before its deadline with {len(bucket.ranks)} of "
                                       f"{bucket.world} ranks: the steps waiting for their ranks fill {self._limit()}")
                if not self.counters.budget_writes:
                    self.last_problem = self.budget_problem
                self.counters.budget_writes += 1
                return True
        return False

    def _refuse(self, entry_id: bytes, rec: StepRecord, out: Output) -> None:
        """Not one step of rec's shape fits: skipped, counted, said."""
        self.counters.over_budget += 1
        shape = list(rec.counts_LE.shape)
        self.budget_problem = (f"step {rec.step} rank {rec.rank}: counts {shape} ({format_bytes(rec.counts_LE.size * 4)} "
                               f"a step) do not fit {self._limit()}: skipped")
        self._skip(entry_id, out, self.budget_problem)

    def _limit(self) -> str:
        if self.budget is None:
            return f"the {self.max_rows} steps this run may hold"
        cap = "" if self.max_rows is None else f"; this run may hold {self.max_rows} steps of {format_bytes(self._row_bytes)}"
        return f"{self.budget.describe()}{cap}"

    def release(self) -> None:
        """Give this assembler's bytes back to the budget now (it is being dropped)."""
        if self._reservation is not None:
            self._reservation.release()
            self._reservation, self.max_rows = None, 0  # nothing more is taken by a dropped assembler

    @property
    def shape_bytes(self) -> int:
        """Bytes of one int32 [L, E] of this run (0 before its shape is known)."""
        return self._row_bytes

    @property
    def reserved_bytes(self) -> int:
        """Bytes this assembler holds for pending steps and held records."""
        return self._rows * self._row_bytes

    # --------------------------------------------------------------------------------------------- output
    def _emit(self, bucket: _Bucket, late: bool) -> Emitted:
        if bucket.rows:
            self._unreserve(bucket.rows)
            bucket.rows = 0
        ranks = sorted(bucket.ranks)
        ranks_R = np.asarray(ranks, dtype=np.int64)
        values = [bucket.ranks[r] for r in ranks]
        tokens_R = np.fromiter((v[0] for v in values), dtype=np.int64, count=len(values))
        dropped_R = np.fromiter((v[1] for v in values), dtype=np.int64, count=len(values))
        phase = next(iter(bucket.phases)) if len(bucket.phases) == 1 else "mixed"
        scope = next(iter(bucket.scopes)) if len(bucket.scopes) == 1 else "rank"
        record = AggregateRecord(
            run=self.run, step=bucket.step, time_s=bucket.time_s, phase=phase, world_size=bucket.world,
            counts_LE=bucket.counts_LE(), ranks_R=ranks_R, tokens_R=tokens_R, dropped_R=dropped_R,
            instance=self.epoch or "", late=late, scope=scope)
        mask = 0
        for rank in ranks:
            mask |= 1 << rank
        step = bucket.step
        self.written[step] = self.written.pop(step, 0) | mask  # re-inserted: newest written last
        if late:
            self.counters.late_records += 1
            self.counters.late_ranks += len(ranks)
        else:
            self.counters.steps_written += 1
            missing = bucket.world - len(ranks)
            if missing:
                self.counters.rank_steps_missing += missing
                self.last_missing = (step, record.missing_ranks[:MAX_NAMED].tolist())
        self.last_step = max(self.last_step, step)
        while len(self.written) > self.remember_steps:
            forgotten = next(iter(self.written))
            del self.written[forgotten]
            self.horizon = max(self.horizon, forgotten + 1)
        return Emitted(record, tuple(bucket.entry_ids))


def entry_id_key(entry_id: bytes | str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as a sortable (ms, seq); (0, 0) for anything else."""
    text = entry_id.decode("ascii", "replace") if isinstance(entry_id, (bytes, bytearray)) else str(entry_id)
    ms, _, seq = text.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0

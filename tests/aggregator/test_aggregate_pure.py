"""The aggregator's pure parts: assembly of rank records into steps, the layout book, the rollup builder, the
progress hash and the options (no Redis here; tests/aggregator/test_aggregate.py drives the real thing)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.aggregator import AggregateOptions, Assembler, LayoutBook, RollupBuilder, bucket_rollup
from moe_monitor.aggregator.progress import decode_progress, encode_progress
from moe_monitor.aggregator.rollup import RollupCounters, StepEntry
from moe_monitor.core.assembly import Counters
from moe_monitor.core.loadmodel import balancedness, gpu_loads

L, E = 3, 8


def rec(step: int, rank: int, world: int = 4, counts=None, inst: str = "c", t: float = 1000.0,
        phase: str = "decode", tokens: int = 4) -> core.StepRecord:
    if counts is None:
        counts = np.random.default_rng(step * 1000 + rank).integers(0, 50, (L, E)).astype(np.int32)
    return core.StepRecord(run="r", rank=rank, world_size=world, step=step, time_s=t, phase=phase, tokens=tokens,
                           counts_LE=np.asarray(counts, dtype=np.int32), instance=inst, dropped_steps=rank)


def ids(n: int, start: int = 0) -> list[bytes]:
    return [f"{1000 + i}-0".encode() for i in range(start, start + n)]


def feed(assembler: Assembler, records: list[core.StepRecord], now: float = 0.0, first: int = 0):
    entries = list(zip(ids(len(records), first), records))
    return assembler.add(entries, now), entries


def test_a_step_is_written_once_all_its_ranks_arrived_with_the_exact_sum():
    a = Assembler("r", deadline_s=1.0)
    records = [rec(0, r) for r in (3, 1, 0)]
    out, _ = feed(a, records)
    assert not out.emitted and a.pending_steps == 1
    out, _ = feed(a, [rec(0, 2)], first=3)
    (emitted,) = out.emitted
    agg = emitted.record
    assert agg.ranks_R.tolist() == [0, 1, 2, 3] and not agg.late and agg.instance == "c"
    assert (agg.counts_LE == sum(rec(0, r).counts_LE.astype(np.int64) for r in range(4))).all()
    assert agg.dropped_R.tolist() == [0, 1, 2, 3] and agg.tokens == 16 and agg.counts_LE.dtype == np.int64
    assert set(emitted.entry_ids) == set(ids(4)) and a.counters.steps_written == 1


def test_deadline_writes_a_step_short_naming_and_counting_its_missing_ranks():
    a = Assembler("r", deadline_s=1.0)
    feed(a, [rec(7, 0), rec(7, 3)], now=10.0)
    assert not a.due(10.9).emitted
    (emitted,) = a.due(11.0).emitted
    assert emitted.record.missing_ranks.tolist() == [1, 2]
    assert a.counters.rank_steps_missing == 2 and a.last_missing == (7, [1, 2])


def test_a_late_rank_is_its_own_entry_and_duplicates_are_skipped():
    a = Assembler("r", deadline_s=1.0)
    feed(a, [rec(1, 0), rec(1, 1), rec(1, 1)], now=0.0)  # rank 1 twice while pending
    (first,) = a.due(2.0).emitted
    out, _ = feed(a, [rec(1, 3), rec(1, 2), rec(1, 3), rec(1, 0)], now=3.0, first=3)
    (late,) = out.emitted
    assert late.record.late and late.record.ranks_R.tolist() == [2, 3]
    assert not set(first.record.ranks_R.tolist()) & set(late.record.ranks_R.tolist())
    total = first.record.counts_LE + late.record.counts_LE
    assert (total == sum(rec(1, r).counts_LE.astype(np.int64) for r in range(4))).all()
    assert a.counters.duplicates == 3 and a.counters.late_records == 1 and a.counters.late_ranks == 2
    assert len(out.acks) == 2  # the two duplicates of the second batch


def test_every_entry_comes_back_exactly_once_whatever_the_order():
    rng = np.random.default_rng(5)
    a = Assembler("r", deadline_s=1.0, max_pending_steps=8)
    pool = [rec(int(rng.integers(0, 30)), int(rng.integers(0, 4))) for _ in range(400)]
    seen: list[bytes] = []
    sent: list[bytes] = []
    for i in range(0, len(pool), 37):
        batch = pool[i:i + 37]
        out, entries = feed(a, batch, now=i / 40, first=i)
        sent += [e[0] for e in entries]
        seen += [x for em in out.emitted for x in em.entry_ids] + out.acks
        due = a.due(i / 40)
        seen += [x for em in due.emitted for x in em.entry_ids] + due.acks
    due = a.due(1e9)
    seen += [x for em in due.emitted for x in em.entry_ids] + due.acks
    assert sorted(seen) == sorted(sent) and a.pending_steps == 0


def test_most_ranks_restarting_flush_the_old_epoch_then_start_a_new_one_with_their_held_records():
    a = Assembler("r", deadline_s=5.0)
    feed(a, [rec(s, r, inst=f"old{r}") for s in range(3) for r in range(4)][:-1])  # step 2 misses rank 3
    out, _ = feed(a, [rec(0, 0, inst="new0", t=1010.0), rec(0, 1, inst="new1", t=1010.0)], first=20)
    assert not out.emitted and not out.acks and a.held_ranks == [0, 1] and a.epoch == "old0"  # 2 of 4: held
    assert a.oldest_pending_id() == ids(1, 8)[0]  # step 2's first entry; the held entries are newer
    out, _ = feed(a, [rec(0, 2, inst="new2", t=1010.0), rec(2, 3, inst="old3")], first=30)
    flushed = out.emitted[0]
    assert flushed.record.step == 2 and flushed.record.instance == "old0"
    assert flushed.record.missing_ranks.tolist() == [3]
    assert a.epoch == "new2" and a.counters.epochs == 2 and a.counters.stale_records == 1
    assert a.instance_of_rank == {0: "new0", 1: "new1", 2: "new2"} and "old3" in a.retired and a.held_ranks == []
    out, _ = feed(a, [rec(0, 3, inst="new3", t=1010.0)], first=40)
    (step0,) = out.emitted
    assert step0.record.instance == "new2" and step0.record.step == 0 and step0.record.ranks_R.tolist() == [0, 1, 2, 3]
    assert set(step0.entry_ids) == {ids(1, 20)[0], ids(1, 21)[0], ids(1, 30)[0], ids(1, 40)[0]}


def test_one_rank_restarting_retires_that_rank_only_and_the_others_go_on():
    a = Assembler("r", deadline_s=5.0)
    feed(a, [rec(s, r, inst=f"old{r}") for s in range(10) for r in range(4)])
    restarted = rec(0, 0, inst="new0", t=1010.0)  # rank 0's collector stopped 10 s ago and came back
    out, _ = feed(a, [restarted], first=40)
    assert not out.emitted and a.held_ranks == [0] and a.counters.rank_restarts == 1 and a.counters.epochs == 1
    later = [rec(s, r, inst=f"old{r}", t=1010.0) for s in range(10, 20) for r in range(1, 4)]
    out, entries = feed(a, later, first=50)
    assert a.epoch == "old0" and a.counters.epochs == 1  # no new epoch: the run goes on
    done = a.due(10.0)
    steps = {e.record.step: e.record for e in out.emitted + done.emitted}
    assert sorted(steps) == list(range(10, 20))
    assert all(r.ranks_R.tolist() == [1, 2, 3] for r in steps.values())  # the other ranks' steps are all written


def test_a_restarted_rank_whose_step_ids_go_on_counts_at_once_and_one_behind_rejoins_when_it_catches_up():
    a = Assembler("r", deadline_s=5.0)
    feed(a, [rec(s, r, inst=f"a{r}", world=2) for s in range(5) for r in range(2)])
    out, _ = feed(a, [rec(5, 0, inst="b0", world=2), rec(5, 1, inst="a1", world=2)], first=10)  # ids go on: no hold
    assert [e.record.step for e in out.emitted] == [5] and out.emitted[0].record.ranks_R.tolist() == [0, 1]
    out, _ = feed(a, [rec(0, 1, inst="b1", world=2, t=1010.0), rec(6, 0, inst="b0", world=2, t=1010.0)],
                  first=20)  # rank 1 from 0 again, 10 s after a1's last record: held
    assert a.held_ranks == [1] and a.counters.epochs == 1
    out, _ = feed(a, [rec(6, 1, inst="b1", world=2, t=1010.0)], first=30)  # reached rank 0's newest: it counts again
    assert a.held_ranks == [] and a.counters.held_records == 1 and out.acks == ids(1, 20)
    assert [e.record.step for e in out.emitted] == [6] and out.emitted[0].record.ranks_R.tolist() == [0, 1]


def test_a_world_claim_beyond_the_metadata_and_a_huge_step_id_are_counted_and_stop_nothing():
    a = Assembler("r", deadline_s=5.0)
    a.meta_world = 4
    out, _ = feed(a, [rec(0, r) for r in range(3)] + [rec(0, 3, world=65_536), rec(0, 9, world=65_536)])
    assert a.counters.world_claims == 2 and out.acks == ids(1, 4) and "4 ranks" in a.last_problem  # rank 9: out
    assert [(e.record.step, e.record.world_size) for e in out.emitted] == [(0, 4)]  # complete under world 4
    out, _ = feed(a, [rec(4_600_000_000_000_000_000, 0)] + [rec(1, r) for r in range(3)], first=10)
    assert a.counters.implausible_steps == 1 and out.acks == ids(1, 10)
    done = a.due(10.0)
    assert [e.record.missing_ranks.tolist() for e in done.emitted] == [[3]] and a.last_step == 1
    assert a.counters.rank_steps_missing == 1  # not 65,532


def test_held_records_are_bounded_and_every_entry_comes_back_once():
    from moe_monitor.core import assembly
    a = Assembler("r", deadline_s=5.0)
    feed(a, [rec(s, r, inst=f"a{r}") for s in range(10_000, 10_003) for r in range(4)])
    held = [rec(s, 0, inst="b0", t=1010.0) for s in range(assembly.MAX_HELD + 5)]
    out, entries = feed(a, held, first=100)
    assert a.counters.held_records == 5 and out.acks == [e for e, _ in entries[:5]]
    out2, _ = feed(a, [rec(0, r, inst=f"b{r}", t=1010.0) for r in (1, 2)], first=100 + len(held))  # most restarted
    out2.extend(a.due(100.0))  # the new epoch's steps, written at their deadline
    emitted_ids = [x for em in out2.emitted for x in em.entry_ids]
    assert a.counters.epochs == 2 and a.held_ranks == []
    assert sorted(emitted_ids + out2.acks) == sorted([e for e, _ in entries[5:]] + ids(2, 100 + len(held)))


def test_bad_shapes_are_bad_records_and_old_steps_are_too_old():
    a = Assembler("r", deadline_s=1.0, remember_steps=16)
    feed(a, [rec(0, 0, world=1)])
    out, _ = feed(a, [rec(1, 0, world=1, counts=np.ones((L, E + 1)))], first=1)
    assert a.counters.bad_records == 1 and out.acks == ids(1, 1)
    feed(a, [rec(s, 0, world=1) for s in range(2, 40)], first=2)
    assert a.horizon > 0 and len(a.written) == 16
    out, _ = feed(a, [rec(0, 0, world=1), rec(1, 0, world=1)], first=50)
    assert a.counters.too_old == 2 and a.counters.duplicates == 0  # forgotten: whether written cannot be told
    assert not out.emitted and len(out.acks) == 2
    out, _ = feed(a, [rec(39, 0, world=1)], first=60)
    assert a.counters.duplicates == 1  # remembered


def test_sums_stay_exact_beyond_int32():
    a = Assembler("r", deadline_s=1.0)
    big = np.full((L, E), 2**31 - 1, dtype=np.int64)
    out, _ = feed(a, [rec(0, r, counts=big) for r in range(4)])
    assert (out.emitted[0].record.counts_LE == 4 * (2**31 - 1)).all()


def test_pending_steps_are_bounded_oldest_first():
    a = Assembler("r", deadline_s=100.0, max_pending_steps=3)
    out, _ = feed(a, [rec(s, 0) for s in (5, 1, 9, 4)])
    assert [e.record.step for e in out.emitted] == [5] and a.pending_steps == 3


def test_restore_takes_a_predecessors_state():
    a = Assembler("r", deadline_s=1.0)
    a.restore("e", {0: "c", 1: "c"}, ["gone"], {4: 0b0011}, horizon=3, counters=Counters(steps_written=9))
    out, _ = feed(a, [rec(4, 0, inst="c"), rec(4, 2, inst="c"), rec(2, 1, inst="c"), rec(5, 0, inst="gone")])
    (late,) = out.emitted
    assert late.record.late and late.record.ranks_R.tolist() == [2] and late.record.instance == "e"
    c = a.counters
    assert (c.duplicates, c.too_old, c.stale_records, c.late_ranks, c.steps_written) == (1, 1, 1, 1, 9)


# ------------------------------------------------------------------------------------------------ layouts
def test_the_layout_in_force_follows_the_changes_of_the_epoch():
    book = LayoutBook()
    base = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1]] * L)  # 10 slots on 2 GPUs, experts 0 and 1 replicated
    moved = np.array([[7, 6, 5, 4, 3, 2, 1, 0, 7, 6]] * L)
    book.set_base(base, 2)
    book.add("e", 10, moved, 2)
    groups = book.layouts("e", np.array([3, 10, 12, 9]), L, E, world=4)
    assert [g[0].tolist() for g in groups] == [[0, 3], [1, 2]]
    for (_, layout, gpus), want in zip(groups, (base, moved)):
        assert gpus == 2 and (layout == want).all()
    assert (book.layouts("other", np.array([50]), L, E, 4)[0][1] == base).all()  # another epoch: the base layout
    book.set_base(np.array([[0, 1]] * L), 1)  # does not fit 8 experts: contiguous over default_gpus(8, 4) = 4
    (_, layout, gpus), = book.layouts("other", np.array([1]), L, E, 4)
    assert gpus == 4 and (layout == np.arange(E)).all()


# ------------------------------------------------------------------------------------------------ rollups
def agg(step: int, t: float, counts=None, ranks=(0, 1), world: int = 2, late: bool = False,
        epoch: str = "e") -> core.AggregateRecord:
    if counts is None:
        counts = np.random.default_rng(step).integers(0, 40, (L, E))
    ranks_R = np.asarray(ranks, dtype=np.int64)
    return core.AggregateRecord(run="r", step=step, time_s=t, phase="decode", world_size=world,
                                counts_LE=np.asarray(counts, dtype=np.int64), ranks_R=ranks_R,
                                tokens_R=np.full(ranks_R.size, 4), dropped_R=np.zeros(ranks_R.size, dtype=np.int64),
                                instance=epoch, late=late)


def test_bucket_statistics_match_a_direct_computation():
    layout = np.array([list(range(E))] * L)
    book = LayoutBook()
    book.set_base(layout, 4)
    counts = [np.random.default_rng(s).integers(0, 40, (L, E)) for s in range(5)]
    counts[2][1] = 0  # an idle layer: left out of the histogram
    steps = [StepEntry("e", s, "decode", 2, c, 8, missing_ranks=s % 2) for s, c in enumerate(counts)]
    record = bucket_rollup("r", 1, 100, steps, book)
    loads = np.stack([gpu_loads(c, layout, 4) for c in counts])
    eta = balancedness(loads)
    assert (record.eta_hist_B == core.eta_histogram(eta)).all() and record.eta_hist_B.sum() == 5 * L - 1
    assert record.eta_quantile(0.5) == core.eta_quantile(core.eta_histogram(eta), 0.5)
    assert record.max_load_sum == pytest.approx(loads.max(-1).mean(-1).sum())
    assert record.mean_load_sum == pytest.approx(loads.mean(-1).mean(-1).sum())
    assert record.max_load_peak == pytest.approx(loads.max()) and record.gpus == 4
    assert (record.counts_LE == sum(counts)).all() and record.steps == 5 and record.missing_rank_steps == 2


def test_seconds_close_by_data_time_or_idle_wall_clock_and_minutes_merge_them():
    b = RollupBuilder("r", LayoutBook(), grace_s=1.0)
    for s in range(6):
        b.add(agg(s, 600.0 + s * 0.3), now_s=0.0, wall_s=600.0)
    assert b.close_due(now_s=0.0, wall_s=600.0) == []
    b.add(agg(6, 603.2), now_s=0.0, wall_s=603.2)  # pushes seconds 600 and 601 past their end + grace
    closed = b.close_due(now_s=0.0, wall_s=603.2)
    assert [(r.resolution_s, r.start_s, r.steps) for r in closed] == [(1, 600, 4), (1, 601, 2)]
    assert b.close_due(now_s=0.5, wall_s=700.0) == []  # the wall clock is past, but the second is not idle yet
    closed = b.close_due(now_s=5.0, wall_s=700.0)
    assert [(r.resolution_s, r.start_s, r.steps) for r in closed] == [(1, 603, 1), (60, 600, 7)]
    minute = closed[-1]
    assert (minute.counts_LE == sum(agg(s, 0).counts_LE for s in range(7))).all()
    assert minute.eta_hist_B.sum() == 7 * L and b.counters.buckets_1s == 3 and b.counters.buckets_60s == 1


def test_late_ranks_fold_into_their_open_second_else_their_minute_else_they_are_dropped():
    b = RollupBuilder("r", LayoutBook(), grace_s=1.0)
    b.add(agg(0, 600.2), 0.0, 600.2)
    b.add(agg(0, 600.9, ranks=(1,), world=2, late=True), 0.0, 600.9)
    b.add(agg(1, 602.5), 0.0, 602.5)
    (second, ) = b.close_due(0.0, 602.5)
    assert second.late_rank_steps == 1 and second.steps == 1
    assert (second.counts_LE == agg(0, 0).counts_LE + agg(0, 0, ranks=(1,)).counts_LE).all()
    b.add(agg(0, 601.0, ranks=(0,), late=True), 0.0, 603.0)  # its second closed: into the minute
    b.add(agg(2, 600.5), 0.0, 603.0)  # a step for a closed second: into the minute as well
    closed = b.close_due(10.0, 700.0)
    minute = closed[-1]
    assert minute.resolution_s == 60 and minute.steps == 3 and minute.late_rank_steps == 2
    b.add(agg(3, 601.5), 20.0, 700.0)  # its second and its minute closed: dropped, counted
    b.add(agg(3, 601.5, ranks=(1,), late=True), 20.0, 700.0)
    assert b.close_due(40.0, 800.0) == []
    assert (b.counters.dropped_steps, b.counters.dropped_late_ranks) == (1, 1)


def test_buckets_written_by_a_predecessor_feed_the_minute_without_being_written_again():
    b = RollupBuilder("r", LayoutBook(), grace_s=1.0)
    b.already_written(1, 601)
    for s, t in enumerate((600.5, 601.5, 602.5)):
        b.add(agg(s, t), 0.0, t)
    closed = b.close_due(10.0, 700.0)
    assert [(r.resolution_s, r.start_s) for r in closed] == [(1, 602), (60, 600)] and closed[-1].steps == 3


def test_a_step_from_the_future_counts_in_the_present_second():
    b = RollupBuilder("r", LayoutBook(), grace_s=1.0)
    b.add(agg(0, 5000.0), 0.0, 600.0)
    (second, minute) = b.close_due(10.0, 700.0)
    assert second.start_s == 600 and minute.start_s == 600


# ------------------------------------------------------------------------------------------------ progress, options
def test_progress_round_trip_and_unreadable_fields():
    fields = encode_progress(Counters(steps_written=5, late_ranks=2), RollupCounters(buckets_1s=3), epoch="e1",
                             last_step=41, pending_steps=2, lag_entries=-1, entries_per_s=12.5, consumer="me",
                             time_s=1.5, commit="me/3", last_problem="x" * 1000, instances={1: "a", 0: "b"},
                             retired=["z"])
    raw = {k.encode(): str(v).encode() for k, v in fields.items()}
    back = decode_progress(raw)
    assert back.counters.steps_written == 5 and back.counters.late_ranks == 2 and back.rollups.buckets_1s == 3
    assert (back.epoch, back.last_step, back.instances, back.retired) == ("e1", 41, {0: "b", 1: "a"}, ["z"])
    assert len(fields["last_problem"]) == 300 and back.commit == "me/3"
    bad = decode_progress({b"steps_written": b"lots", b"instances": b"{", b"retired": b"[1", b"duplicates": b"-4"})
    assert bad.counters.steps_written == 0 and bad.instances is None
    assert set(bad.problems) == {"steps_written", "instances", "retired", "duplicates"}
    assert decode_progress({}).epoch is None


@pytest.mark.parametrize("change, message", [
    (dict(deadline_s=0), "deadline_s"), (dict(read_count=0), "read_count"), (dict(agg_maxlen=True), "agg_maxlen"),
    (dict(retention_60s_s=59), "retention_60s_s"), (dict(lease_s=math.nan), "lease_s"),
    (dict(block_ms=3000, timeout_s=2.0), "below the socket timeout"),
])
def test_options_refuse_what_cannot_work(change, message):
    with pytest.raises(ValueError, match=message):
        AggregateOptions(**change)
    assert AggregateOptions().grace_s == 3.0 and AggregateOptions(rollup_grace_s=0.5).grace_s == 0.5


def test_the_held_ranks_survive_a_takeover_through_the_progress_hash():
    fields = encode_progress(Counters(rank_restarts=2, held_records=7), RollupCounters(), epoch="e", last_step=9,
                             pending_steps=0, lag_entries=0, entries_per_s=0.0, consumer="c", time_s=1.0,
                             commit="c/1", last_problem="", instances={0: "a", 1: "b"}, retired=[], held=[1])
    back = decode_progress({k.encode(): str(v).encode() for k, v in fields.items()})
    assert back.held == [1] and back.counters.held_records == 7 and not back.problems
    a = Assembler("r")
    a.restore(back.epoch, back.instances or {}, back.retired, {}, 0, back.counters, held=back.held)
    assert a.held_ranks == [1]

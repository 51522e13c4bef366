"""The dashboard reading aggregated steps (core.AggregateRecord, one per step with its ranks summed by the
aggregator) against a real redis-server: entries written with core.encode_aggregate + XADD, read by
dashboard.sources.aggregate.AggregateReader (directly, and through a small Source that does what the hook in
RedisSource.poll does), folded into the step window. A window filled from aggregates equals, exactly, one filled
from the same per-rank records summed by the dashboard."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.live.window import StepWindow
from moe_monitor.dashboard.sources.aggregate import AggregateReader
from moe_monitor.dashboard.sources.base import Batch, Health
from moe_monitor.dashboard.sources.redis import RedisSource

L, E, GPUS = 3, 16, 4
RUN = "agg-run"


def meta(run: str = RUN, world: int = 4) -> core.RunMeta:
    return core.RunMeta(run=run, model_name="tiny", layer_names=[f"l{i}" for i in range(L)], num_experts=E, top_k=2,
                        hidden_size=8, moe_intermediate_size=8, dtype_bytes=2, world_size=world,
                        layout=core.Layout(gpus=GPUS, nodes=1, physical_to_logical_map=core.contiguous_layout(L, E)))


def rank_records(steps: range, world: int = 4, seed: int = 0, t0: float | None = None, instance: str = "c",
                 skip: dict[int, set[int]] | None = None) -> list[core.StepRecord]:
    """Per-rank records of `steps` (every rank unless skip[step] names it), skewed counts, phases that differ
    between ranks on some steps, growing dropped counts."""
    rng = np.random.default_rng(seed)
    t0 = time.time() - 60.0 if t0 is None else t0
    out = []
    for step in steps:
        for rank in range(world):
            if rank in (skip or {}).get(step, set()):
                continue
            phase = "prefill" if (step + (rank == 2 and step % 5 == 0)) % 4 == 0 else "decode"
            out.append(core.StepRecord(
                run=RUN, rank=rank, world_size=world, step=step, time_s=t0 + step * 0.1 + rank * 0.001, phase=phase,
                tokens=int(rng.integers(1, 64)), counts_LE=rng.gamma(0.5, 40.0, size=(L, E)).astype(np.int32),
                dropped_steps=step // 7 if rank == 1 else 0, instance=f"{instance}{rank}"))
    return out


def aggregate_of(records: list[core.StepRecord], epoch: str = "e1", late: bool = False) -> core.AggregateRecord:
    """What the aggregator writes for these records of one step: ranks summed, phase theirs when they agree."""
    records = sorted(records, key=lambda r: r.rank)
    phases = {r.phase for r in records}
    return core.AggregateRecord(
        run=RUN, step=records[0].step, time_s=max(r.time_s for r in records),
        phase=phases.pop() if len(phases) == 1 else "mixed", world_size=records[0].world_size,
        counts_LE=np.sum([r.counts_LE.astype(np.int64) for r in records], axis=0),
        ranks_R=np.array([r.rank for r in records]), tokens_R=np.array([r.tokens for r in records]),
        dropped_R=np.array([r.dropped_steps for r in records]), instance=epoch, late=late)


def write_steps(client, records: list[core.StepRecord], run: str = RUN) -> None:
    pipe = client.pipeline(transaction=False)
    for rec in records:
        pipe.xadd(core.steps_key(run), core.encode_step(rec))
    pipe.execute()


def write_aggregates(client, records: list[core.AggregateRecord], run: str = RUN) -> None:
    pipe = client.pipeline(transaction=False)
    for rec in records:
        pipe.xadd(core.aggregate_key(run), core.encode_aggregate(rec))
    pipe.execute()


class AggregateSource:
    """A Source over the run's aggregate stream only: RedisSource.poll with the hook, while the aggregate is in
    use (checked at every poll here)."""

    def __init__(self, client, run: str, window_steps: int, **reader_options):
        self.client, self.run = client, run
        self.reader = AggregateReader(client, run, window_steps, check_every_s=0.0, **reader_options)
        self.layouts: list[core.LayoutRecord] = []  # handed over with the next poll

    def poll(self, max_entries: int) -> Batch:
        batch = Batch(layouts=self.layouts)
        self.layouts = []
        self.reader.read(batch, max_entries)
        return batch

    def meta(self) -> core.RunMeta | None:
        raw = self.client.get(core.meta_key(self.run))
        return core.decode_meta(raw) if raw else None

    def health(self) -> Health:
        return Health(reachable=True, where="test")


def assert_same_window(a: WatchedRun, b: WatchedRun) -> None:
    """Counts, tokens, ranks, world, phases, times, dropped counts and GPU loads (under the run's layout) equal."""
    wa, wb = a.window, b.window
    assert wa is not None and wb is not None
    ra, rb = wa.ordered_slots(), wb.ordered_slots()
    for name in ("step_C", "tokens_C", "ranks_C", "world_C", "phase_C", "time_s_C", "steps_C"):
        np.testing.assert_array_equal(getattr(wa, name)[ra], getattr(wb, name)[rb], err_msg=name)
    np.testing.assert_array_equal(wa.counts_CLE[ra], wb.counts_CLE[rb])
    np.testing.assert_array_equal(wa.sums_by_phase_LE, wb.sums_by_phase_LE)
    assert [wa._ranks_seen[s] for s in ra] == [wb._ranks_seen[s] for s in rb]
    def dropped(window):  # the ranks that dropped steps (a rank at 0 may or may not have an entry)
        return {rank: count for rank, count in window.dropped_by_rank.items() if count}
    assert dropped(wa) == dropped(wb) and dropped(wa)
    assert a.dropped_steps == b.dropped_steps and a.world_size == b.world_size
    layout = resolve_layout(meta(), L, E, 4)
    for phase in ("both", "prefill", "decode"):
        va = wa.view(phase, layout.layout_LP, GPUS, now_s=time.time() + 60)
        vb = wb.view(phase, layout.layout_LP, GPUS, now_s=time.time() + 60)
        np.testing.assert_array_equal(va.loads_TLG, vb.loads_TLG)
        np.testing.assert_array_equal(va.counts_sum_LE, vb.counts_sum_LE)
    sa, sb = analyse(wa, layout, "both"), analyse(wb, layout, "both")
    assert sa is not None and sb is not None
    np.testing.assert_array_equal(sa.loads_TG, sb.loads_TG)
    assert sa.missing == sb.missing and sa.straggler == sb.straggler


def test_window_from_aggregates_equals_window_summed_here(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta()))
    # step 5 lost rank 3 for good (the aggregator gave up on it); step 8's rank 2 came late (a second entry)
    records = rank_records(range(20), skip={5: {3}})
    write_steps(client, records)
    by_step: dict[int, list[core.StepRecord]] = {}
    for rec in records:
        by_step.setdefault(rec.step, []).append(rec)
    aggregates = []
    for step, recs in sorted(by_step.items()):
        on_time = [r for r in recs if not (step == 8 and r.rank == 2)]
        if step != 5:  # step 5 is written at its deadline, after the complete ones
            aggregates.append(aggregate_of(on_time))
        if step == 10:  # the late rank of step 8 was folded in two steps later
            aggregates.append(aggregate_of([r for r in by_step[8] if r.rank == 2], late=True))
    aggregates.append(aggregate_of(by_step[5]))
    write_aggregates(client, aggregates)
    # no aggregator holds the run yet; deadline 0: step 5, short of rank 3, is assembled at once
    summed_here = WatchedRun(RedisSource(client, redis_url, RUN, 50), 50, deadline_s=0.0)
    summed_here.tick()
    client.set(core.aggregator_key(RUN), "owner", px=60_000)  # now one does
    from_aggregate = WatchedRun(AggregateSource(client, RUN, 50), 50)
    tick = from_aggregate.tick()
    assert tick.aggregates_in == 21 and tick.steps_in == 0 and from_aggregate.bad_records == 0
    assert from_aggregate.feed == "aggregate" and summed_here.feed == "steps"
    assert from_aggregate.aggregates_read == 21 and from_aggregate.missed_steps == 0
    assert from_aggregate.steps_read == summed_here.steps_read == 79  # the per-rank records behind them
    assert_same_window(from_aggregate, summed_here)
    snap = analyse(from_aggregate.window, resolve_layout(meta(), L, E, 4), "both")
    assert snap.missing.rank_steps == 1 and snap.missing.by_rank == ((3, 1),)

    # later steps arrive in both forms, read forwards by both
    more = rank_records(range(20, 26), seed=1, t0=records[-1].time_s + 0.1 - 2.0)
    write_steps(client, more)
    write_aggregates(client, [aggregate_of([r for r in more if r.step == s]) for s in range(20, 26)])
    summed_here.tick()
    assert from_aggregate.tick().aggregates_in == 6
    assert_same_window(from_aggregate, summed_here)


def test_reader_pages_the_newest_window_within_the_byte_budget_then_reads_forwards(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    recs = rank_records(range(40), world=2)
    write_aggregates(client, [aggregate_of([r for r in recs if r.step == s]) for s in range(40)])
    client.set(core.aggregator_key(RUN), "owner", px=60_000)
    one = len(core.encode_aggregate(aggregate_of(recs[:2]))["counts"]) + 300
    reader = AggregateReader(client, RUN, window_steps=25, check_every_s=0.0, page_entries=4, bytes_budget=10 * one)
    polls = []
    while True:
        batch = Batch()
        assert reader.read(batch, 1000)
        polls.append(batch)
        if not batch.more:
            break
    assert len(polls) >= 2 and all(not p.aggregates for p in polls[:-1])  # handed over once collected
    assert [a.step for a in polls[-1].aggregates] == list(range(15, 40))
    more = rank_records(range(40, 70), world=2, seed=2)
    write_aggregates(client, [aggregate_of([r for r in more if r.step == s]) for s in range(40, 70)])
    forwards = []
    while not forwards or forwards[-1].more:
        forwards.append(Batch())
        reader.read(forwards[-1], 1000)
    assert len(forwards) >= 2  # the byte budget split the 30 new entries over polls, each handed over at once
    assert all(0 < len(b.aggregates) <= 12 for b in forwards[:-1])
    assert [a.step for b in forwards for a in b.aggregates] == list(range(40, 70))
    capped = Batch()
    write_aggregates(client, [aggregate_of(rank_records(range(70, 75), world=2, seed=3)[i:i + 2])
                              for i in range(0, 10, 2)])
    reader.read(capped, 3)
    assert [a.step for a in capped.aggregates] == [70, 71, 72] and capped.more


def test_in_use_follows_the_aggregators_lease(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    recs = rank_records(range(3), world=2)
    write_steps(client, recs)
    reader = AggregateReader(client, RUN, 10, check_every_s=0.0)
    assert not reader.read(Batch(), 100)  # no aggregate stream: the readers sum the ranks themselves
    write_aggregates(client, [aggregate_of(recs[i:i + 2]) for i in (0, 2, 4)])
    assert not reader.read(Batch(), 100)  # an aggregate without a live aggregator while steps flow: not used
    client.set(core.aggregator_key(RUN), "owner", px=60_000)
    batch = Batch()
    assert reader.read(batch, 100) and [a.step for a in batch.aggregates] == [0, 1, 2] and reader.switches == 1
    client.delete(core.aggregator_key(RUN))  # the aggregator stopped
    assert not reader.read(Batch(), 100) and reader.switches == 2
    client.delete(core.steps_key(RUN))  # a finished run whose per-rank steps are gone: the aggregate is all there is
    batch = Batch()
    assert reader.read(batch, 100) and [a.step for a in batch.aggregates] == [0, 1, 2]
    slow = AggregateReader(client, RUN, 10, check_every_s=3600.0)
    assert slow.read(Batch(), 100) and slow.checked_s > 0  # decided once, then kept for the interval


def test_bad_entries_are_counted_and_the_rest_is_read(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta(world=2)))
    recs = rank_records(range(4), world=2)
    good = [core.encode_aggregate(aggregate_of(recs[i:i + 2])) for i in (0, 2, 4, 6)]
    broken = dict(good[1], counts=good[1]["counts"][:-5])
    client.xadd(core.aggregate_key(RUN), good[0])
    client.xadd(core.aggregate_key(RUN), broken)
    client.xadd(core.aggregate_key(RUN), {"v": 1, "junk": b"\xff"})
    client.xadd(core.aggregate_key(RUN), dict(good[2], L=9))  # counts of another shape than declared
    client.xadd(core.aggregate_key(RUN), good[3])
    client.xadd(core.aggregate_key(RUN), good[3])  # the same step twice: the window holds it already
    watched = WatchedRun(AggregateSource(client, RUN, 20), 20)
    tick = watched.tick()
    assert tick.aggregates_in == 3 and watched.bad_records == 3 and tick.bad == 3
    assert watched.skipped_overlap == 1 and "counts" in watched.last_error
    assert list(watched.window.step_C[watched.window.ordered_slots()]) == [0, 3]
    wrong = aggregate_of([core.StepRecord(run=RUN, rank=0, world_size=2, step=4, time_s=time.time(), phase="decode",
                                          tokens=1, counts_LE=np.ones((L + 1, E), dtype=np.int32))])
    write_aggregates(client, [wrong])
    watched.tick()
    assert watched.bad_records == 4 and "counts are (4, 16)" in watched.last_error
    assert watched.window.size == 2


def test_trimmed_stream_is_reported(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.aggregator_key(RUN), "owner", px=60_000)
    recs = rank_records(range(30), world=1)
    write_aggregates(client, [aggregate_of([r]) for r in recs[:10]])
    reader = AggregateReader(client, RUN, 10, check_every_s=0.0)
    reader.read(Batch(), 100)
    write_aggregates(client, [aggregate_of([r]) for r in recs[10:30]])
    client.xtrim(core.aggregate_key(RUN), maxlen=5, approximate=False)
    batch = Batch()
    reader.read(batch, 100)
    assert batch.trimmed and [a.step for a in batch.aggregates] == list(range(25, 30))
    watched = WatchedRun(AggregateSource(client, RUN, 100), 100)
    watched.tick()
    write_aggregates(client, [aggregate_of([r]) for r in rank_records(range(40, 42), world=1, seed=4)])
    watched.tick()
    assert watched.missed_steps == 10 and "missed 10 steps" in watched.gap_note


def test_late_entries_add_into_their_row_or_are_counted(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta()))
    recs = rank_records(range(8), seed=5)
    write_aggregates(client, [aggregate_of([r for r in recs if r.step == s and r.rank != 3]) for s in range(8)])
    watched = WatchedRun(AggregateSource(client, RUN, 4), 4)  # a window of 4 steps: 4..7
    watched.tick()
    window = watched.window
    assert list(window.ranks_C[window.ordered_slots()]) == [3, 3, 3, 3]
    late = [aggregate_of([r for r in recs if r.step == s and r.rank == 3], late=True) for s in (2, 6)]
    write_aggregates(client, late)
    watched.tick()
    assert watched.late_outside == 1 and watched.bad_records == 0  # step 2 left the window: counted, not added
    assert list(window.ranks_C[window.ordered_slots()]) == [3, 3, 4, 3]
    row = window._slot_of_step[6]
    np.testing.assert_array_equal(window.counts_CLE[row], np.sum([r.counts_LE for r in recs if r.step == 6], axis=0))
    write_aggregates(client, [late[1]])  # the late rank again: a duplicate, not a bad record
    watched.tick()
    assert watched.duplicate_records == 1 and watched.bad_records == 0


def test_a_new_aggregator_epoch_starts_the_window_afresh(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta(world=1)))
    old = rank_records(range(10), world=1, t0=time.time() - 100)
    new = rank_records(range(4), world=1, t0=time.time() - 10, seed=6, instance="n")
    write_aggregates(client, [aggregate_of([r], epoch="A") for r in old])
    layout = core.LayoutRecord(run=RUN, step=3, time_s=old[2].time_s, source="engine", gpus=GPUS,
                               layout_LP=np.tile(np.arange(E)[::-1], (L, 1)), instance="c0")
    source = AggregateSource(client, RUN, 50)
    source.layouts = [layout]
    watched = WatchedRun(source, 50)
    watched.tick()
    assert watched.window.size == 10 and len(watched.layouts) == 1  # any collector's change, while aggregated
    write_aggregates(client, [aggregate_of([r], epoch="B") for r in new])
    write_aggregates(client, [aggregate_of([old[-1]], epoch="A")])  # a straggler of the old epoch
    watched.tick()
    assert watched.restarts == 1 and watched.epoch == "B" and watched.skipped_old_records == 1
    assert list(watched.window.step_C[watched.window.ordered_slots()]) == [0, 1, 2, 3]
    assert len(watched.layouts) == 0  # the old collectors' layout change went with their epoch
    assert watched.restart_note.startswith("collector restarted at")


def test_switching_feeds_neither_doubles_nor_drops_a_step(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta()))
    records = rank_records(range(30))
    write_steps(client, [r for r in records if r.step < 12])
    source = RedisSource(client, redis_url, RUN, 100)
    source._aggregate.check_every_s = 0.0  # asks at every poll whether the aggregate is in use, not every 5 s
    watched = WatchedRun(source, 100)
    watched.tick()
    assert watched.feed == "steps" and watched.window.size == 12
    # the aggregator starts: it aggregates from step 5 on (it caught up with the stream), more steps come
    write_steps(client, [r for r in records if 12 <= r.step < 20])
    write_aggregates(client, [aggregate_of([r for r in records if r.step == s]) for s in range(5, 20)])
    client.set(core.aggregator_key(RUN), "owner", px=60_000)
    watched.tick()
    assert watched.feed == "aggregate" and watched.skipped_overlap == 7 and watched.bad_records == 0
    # the aggregator stops; the per-rank steps are read again from their newest window
    client.delete(core.aggregator_key(RUN))
    write_steps(client, [r for r in records if r.step >= 20])
    watched.tick()
    assert watched.feed == "steps" and watched.feed_switches == 2 and watched.bad_records == 0
    reference = WatchedRun(RedisSource(client, redis_url, RUN, 100), 100)
    reference.tick()
    assert_same_window(watched, reference)


@pytest.mark.parametrize("change, message", [
    (dict(ranks_R=np.array([1, 0])), "ascending"),
    (dict(ranks_R=np.array([0, 4])), "ranks 0..3"),
    (dict(tokens_R=np.array([1])), "one value per rank"),
    (dict(tokens_R=np.array([-1, 2])), "tokens are outside"),
    (dict(phase="warmup"), "unknown phase"),
    (dict(time_s=float("nan")), "finite time"),
    (dict(counts_LE=np.full((L, E), -1, dtype=np.int64)), "negative"),
    (dict(counts_LE=np.full((L, E), 1 << 50, dtype=np.int64)), "0.."),
    (dict(instance="x" * 300), "aggregator instance id"),
])
def test_a_malformed_aggregate_is_refused_and_the_window_left_as_it_was(change, message):
    window = StepWindow(10, L, E)
    base = aggregate_of(rank_records(range(1))[:2])
    assert window.add_aggregate(base)
    before = (window.counts_CLE.copy(), window.ranks_C.copy(), dict(window.dropped_by_rank), window.size)
    with pytest.raises(ValueError, match=message):
        window.add_aggregate(dataclasses.replace(base, step=1, **change))
    assert (window.counts_CLE == before[0]).all() and (window.ranks_C == before[1]).all()
    assert window.dropped_by_rank == before[2] and window.size == before[3]


def test_sums_beyond_int32_widen_the_ring():
    window = StepWindow(4, L, E)
    big = dict(counts_LE=np.full((L, E), 2**31 + 5, dtype=np.int64))
    base = aggregate_of(rank_records(range(1))[:2])
    window.add_aggregate(dataclasses.replace(base, **big))
    assert window.counts_CLE.dtype == np.int64 and int(window.counts_CLE[0, 0, 0]) == 2**31 + 5


def test_a_stolen_or_wedged_lease_makes_readers_sum_the_ranks_until_the_aggregate_moves_again(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta(world=2)))
    recs = rank_records(range(6), world=2)
    write_steps(client, recs[:6])
    write_aggregates(client, [aggregate_of(recs[i:i + 2]) for i in (0, 2, 4)])
    client.set(core.aggregator_key(RUN), "thief", px=3_600_000)  # a stray SET: nobody aggregates behind it
    source = RedisSource(client, redis_url, RUN, 100)
    reader = source._aggregate
    reader.check_every_s, reader.stall_s = 0.0, 0.3
    watched = WatchedRun(source, 100)
    watched.tick()
    assert watched.feed == "aggregate" and watched.window.size == 3 and reader.stall_note == ""
    time.sleep(0.4)  # longer than stall_s: the collectors' next entries are that much newer than the aggregate's
    write_steps(client, recs[6:])  # the collectors keep writing
    watched.tick()
    assert "'thief'" in reader.stall_note and "summed here" in reader.stall_note and reader.stalls == 1
    watched.tick()
    assert watched.feed == "steps" and watched.window.newest_step == 5 and watched.bad_records == 0
    assert "'thief'" in source.health().note
    write_aggregates(client, [aggregate_of(recs[i:i + 2]) for i in (6, 8, 10)])  # an aggregator writes again
    watched.tick()
    assert watched.feed == "aggregate" and reader.stall_note == "" and reader.stalls == 1


def test_steps_still_assembling_at_a_switch_come_from_the_aggregate(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta()))
    records = rank_records(range(10))
    write_steps(client, [r for r in records if r.step < 8 or (r.step < 10 and r.rank < 2)])  # 8, 9 half there
    source = RedisSource(client, redis_url, RUN, 100)
    source._aggregate.check_every_s = 0.0
    watched = WatchedRun(source, 100)
    watched.tick()
    assert watched.feed == "steps" and watched.window.newest_step == 7  # 8 and 9 wait for their ranks
    write_aggregates(client, [aggregate_of([r for r in records if r.step == s]) for s in range(10)])
    client.set(core.aggregator_key(RUN), "owner", px=60_000)  # the aggregator had every rank of 8 and 9
    watched.tick()
    assert watched.feed == "aggregate" and watched.skipped_overlap == 8 and watched.bad_records == 0
    from tests.support.listsource import ListSource

    reference = WatchedRun(ListSource([Batch(steps=records)], meta()), 100)
    reference.tick()
    assert_same_window(watched, reference)


def test_a_record_that_arrived_twice_is_a_duplicate_not_a_bad_record(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    records = rank_records(range(3), world=2)
    write_steps(client, records + records[2:3])  # a retried write of step 1 rank 0 that had landed
    watched = WatchedRun(RedisSource(client, redis_url, RUN, 100), 100)
    watched.tick()
    assert watched.duplicate_records == 1 and watched.bad_records == 0 and watched.window.size == 3


def test_steps_written_at_their_deadline_after_later_ones_are_late_not_missed(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta(world=2)))
    records = rank_records(range(12), world=2)
    by = {s: [r for r in records if r.step == s] for s in range(12)}
    # a rank restarted: steps 4..7 wait for their deadline, 8..11 are complete at once and written first
    order = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7]
    write_aggregates(client, [aggregate_of(by[s]) for s in order[:8]])
    client.set(core.aggregator_key(RUN), "owner", px=60_000)
    watched = WatchedRun(AggregateSource(client, RUN, 100), 100)
    watched.tick()
    # 4 absent, less the one step rank 1 says it dropped meanwhile (rank_records: dropped = step // 7)
    assert watched.missed_steps == 3 and "missed 3 steps" in watched.gap_note
    write_aggregates(client, [aggregate_of(by[s]) for s in order[8:10]])
    watched.tick()
    assert watched.missed_steps == 1 and "missed 1 steps" in watched.gap_note
    write_aggregates(client, [aggregate_of(by[s]) for s in order[10:]])
    watched.tick()
    assert watched.missed_steps == 0 and watched.gap_note == "" and watched.window.size == 12

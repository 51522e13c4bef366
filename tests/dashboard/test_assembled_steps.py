"""One summer: the same per-rank entries, assembled by the reader's in-process core.assembly.Assembler and by
`moe-monitor aggregate`, give identical steps in the dashboard's window (a real redis-server; the aggregator
runs the CLI's own code on a thread)."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np

from moe_monitor import core
from moe_monitor.cli import build_parser
from moe_monitor.cli.aggregate import aggregate
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.base import Batch
from moe_monitor.dashboard.sources.redis import RedisSource
from tests.dashboard.test_dashboard_aggregate import RUN, AggregateSource, meta, rank_records, write_steps
from tests.support.listsource import ListSource
from tests.support.waiting import wait_until

STEPS = 20


def entries() -> list[core.StepRecord]:
    """Steps 0..19 of 4 ranks: step 5 never gets rank 3; step 3's rank 0 is written twice (a retried write);
    step 8's rank 2 comes last; rank 1 restarts at step 15 (a new instance whose step ids start again at 0, so its
    records are held and steps 15..19 are written without it)."""
    records = rank_records(range(STEPS), skip={5: {3}})
    restarted = [r for r in records if r.rank == 1 and r.step >= 15]
    kept = [r for r in records if r not in restarted]
    renumbered = [dataclasses.replace(r, step=r.step - 15, instance="B1") for r in restarted]
    late = [r for r in kept if r.step == 8 and r.rank == 2]
    ordered = [r for r in kept if r not in late]
    retried = [r for r in ordered if r.step == 3 and r.rank == 0]
    return ordered + retried + renumbered + late


def rows(watched: WatchedRun) -> dict[int, tuple]:
    """step -> (counts [L, E], ranks, tokens, world, phase code, time) of every row of the window."""
    window = watched.window
    assert window is not None
    out = {}
    for slot in window.ordered_slots().tolist():
        out[int(window.step_C[slot])] = (window.counts_CLE[slot].astype(np.int64), sorted(window._ranks_seen[slot]),
                                         int(window.tokens_C[slot]), int(window.world_C[slot]),
                                         int(window.phase_C[slot]), float(window.time_s_C[slot]))
    return out


def test_the_reader_and_the_aggregator_assemble_identical_steps(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    client.set(core.meta_key(RUN), core.encode_meta(meta()))
    write_steps(client, entries())

    here = WatchedRun(RedisSource(client, redis_url, RUN, 100), 100, deadline_s=0.3)
    assert wait_until(lambda: here.tick() and here.window is not None and here.window.size == STEPS
                      and here.assembler.pending_steps == 0)

    args = build_parser().parse_args(["aggregate", "--redis", redis_url, "--run", RUN, "--deadline-s", "0.3"])
    stop = threading.Event()
    thread = threading.Thread(target=aggregate, args=(args, stop), daemon=True)
    thread.start()
    try:
        def written() -> set[int]:
            return {core.decode_aggregate(f).step for _, f in client.xrange(core.aggregate_key(RUN))}
        assert wait_until(lambda: written() >= set(range(STEPS)), timeout_s=30.0), written()
    finally:
        stop.set()
        thread.join(timeout=30.0)
    assert not thread.is_alive()
    client.set(core.aggregator_key(RUN), "owner", px=60_000)  # read the aggregate as a page does while one runs
    there = WatchedRun(AggregateSource(client, RUN, 100), 100)
    there.tick()
    assert there.feed == "aggregate" and here.feed == "steps" and there.bad_records == here.bad_records == 0

    mine, theirs = rows(here), rows(there)
    assert sorted(mine) == sorted(theirs) == list(range(STEPS))
    for step in range(STEPS):
        a, b = mine[step], theirs[step]
        np.testing.assert_array_equal(a[0], b[0], err_msg=f"step {step}")
        assert a[1:] == b[1:], step
    assert mine[5][1] == [0, 1, 2] and mine[16][1] == [0, 2, 3] and mine[8][1] == [0, 1, 2, 3]
    assert here.duplicate_records == 1 and here.held_records == 5
    assert here.window.dropped_by_rank == there.window.dropped_by_rank
    assert here.missed_steps == there.missed_steps == 0 and here.restarts == there.restarts == 0


def test_a_recording_is_assembled_at_once():
    """A recorded source (every rank of a step at hand) does not wait for deadlines: a step short of a rank is in
    the window after the first tick."""

    class Recording(ListSource):
        recorded = True

    records = rank_records(range(6), skip={2: {1}})
    watched = WatchedRun(Recording([Batch(steps=records)], meta()), 50)
    watched.tick()
    assert watched.window.size == 6 and watched.assembler.pending_steps == 0
    assert int(watched.window.ranks_C[watched.window._slot_of_step[2]]) == 3
    live = WatchedRun(ListSource([Batch(steps=records)], meta()), 50, deadline_s=600.0)  # a live source waits
    live.tick()
    assert live.window.size == 5 and live.assembler.pending_steps == 1

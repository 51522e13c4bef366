"""Collector restarts under the same run name and gaps in the stream, against a real redis-server."""
import time

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.sources.redis import RedisSource
from tests.support import synthfill

P2L = [list(range(16))] * 4


def test_restart_under_the_same_run_name_starts_a_new_window(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 60
    synthfill.fill(client, "rs", steps=30, instance="old", time0_s=t0)
    watched = WatchedRun(RedisSource(client, redis_url, "rs", window_steps=50), window_steps=50)
    watched.tick()
    assert watched.window.size == 30 and watched.restart_note == ""
    new = synthfill.fill(client, "rs", steps=5, instance="new", time0_s=t0 + 30)  # step ids restart at 0
    watched.tick()
    assert watched.bad_records == 0, watched.last_error
    view = watched.window.view("both", P2L, 4)
    assert list(view.step_T) == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(view.counts_sum_LE, sum(new))
    assert "collector restarted at" in watched.restart_note and watched.restarts == 1
    # a late record of the old collector is skipped, not counted as bad
    synthfill.fill(client, "rs", steps=1, instance="old", first_step=30, time0_s=t0 + 3, meta=False)
    synthfill.fill(client, "rs", steps=1, instance="new", first_step=5, time0_s=t0 + 31, meta=False)
    watched.tick()
    assert watched.bad_records == 0 and watched.skipped_old_records == 1
    assert list(watched.window.view("both", P2L, 4).step_T) == [0, 1, 2, 3, 4, 5]


def test_restart_is_shown_on_the_page(redis_url, monkeypatch):
    from tests.support.apptest import run_app

    client = core.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 60
    synthfill.fill(client, "rp", steps=30, instance="old", time0_s=t0)
    synthfill.fill(client, "rp", steps=6, instance="new", time0_s=t0 + 30, meta=False)
    at = run_app(redis_url, monkeypatch)
    assert any("collector restarted at" in c.value and "6 steps in window" in c.value for c in at.caption), \
        [c.value for c in at.caption]
    assert not any("bad record" in w.value for w in at.warning)


def test_backlog_is_read_in_pages_within_a_byte_budget(redis_url, monkeypatch):
    from moe_monitor.dashboard.sources import redis as redis_source
    from moe_monitor.dashboard.sources import streams

    client = core.connect(redis_url, timeout_s=2.0)
    totals = synthfill.fill(client, "pg", steps=30)
    monkeypatch.setattr(redis_source, "PAGE_ENTRIES", 4)
    entry_bytes = streams.entry_bytes(client.xrange(core.steps_key("pg"), count=1)[0][1])
    monkeypatch.setattr(redis_source, "TICK_BYTES_BUDGET", 10 * entry_bytes)  # ~10 entries a tick
    watched = WatchedRun(RedisSource(client, redis_url, "pg", window_steps=25), window_steps=25)
    ticks = [watched.tick() for _ in range(3)]
    assert [t.steps_in for t in ticks] == [0, 0, 25] and ticks[0].more and ticks[1].more
    view = watched.window.view("both", P2L, 4)
    assert list(view.step_T) == list(range(5, 30))
    np.testing.assert_array_equal(view.counts_sum_LE, sum(totals[5:]))
    synthfill.fill(client, "pg", steps=15, first_step=30, meta=False)
    forward = watched.tick()
    assert forward.steps_in < 15 and forward.more  # the budget holds for forward reads too
    while watched.tick().more:
        pass
    assert watched.window.view("both", P2L, 4).step_T[-1] == 44 and watched.missed_steps == 0


def test_steps_trimmed_before_they_were_read_are_reported(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "gap", steps=10, instance="a")
    watched = WatchedRun(RedisSource(client, redis_url, "gap", window_steps=100), window_steps=100)
    watched.tick()
    synthfill.fill(client, "gap", steps=20, first_step=10, instance="a", meta=False)
    client.xtrim(core.steps_key("gap"), maxlen=5, approximate=False)  # steps 10..24 never read
    watched.tick()
    assert watched.missed_steps == 15 and watched.bad_records == 0
    assert watched.gap_note == "missed 15 steps (stream trimmed before the dashboard read them)"


def test_one_rank_restarting_does_not_hide_the_other_ranks(redis_url):
    """Each rank has its own collector instance; when rank 1 restarts, rank 0's records still count, the window
    is not started afresh, and rank 1 counts again once its step ids reach rank 0's."""
    client = core.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 60
    synthfill.fill(client, "r2", steps=10, world_size=2, ranks=[0], instance="A0", time0_s=t0)
    synthfill.fill(client, "r2", steps=10, world_size=2, ranks=[1], instance="A1", time0_s=t0, meta=False)
    # deadline 0: a step short of a rank is assembled at the tick that read it (the rank is not coming)
    watched = WatchedRun(RedisSource(client, redis_url, "r2", window_steps=50), window_steps=50, deadline_s=0.0)
    watched.tick()
    assert watched.window.size == 10
    synthfill.fill(client, "r2", steps=3, world_size=2, ranks=[1], instance="B1", time0_s=t0 + 30, meta=False)
    synthfill.fill(client, "r2", steps=3, world_size=2, ranks=[0], instance="A0", first_step=10,
                   time0_s=t0 + 31, meta=False)
    watched.tick()
    assert watched.restarts == 0 and watched.skipped_old_records == 0, watched.last_error
    assert watched.held_records == 3 and "rank 1" in watched.held_note and "behind" in watched.held_note
    assert watched.instance_of_rank == {0: "A0", 1: "B1"}
    assert list(watched.window.view("both", P2L, 4).step_T) == list(range(13))  # rank 0's steps go on
    late_old = synthfill.fill(client, "r2", steps=1, world_size=2, ranks=[1], instance="A1", first_step=10,
                              time0_s=t0 + 5, meta=False)
    watched.tick()
    assert late_old and watched.skipped_old_records == 1  # only the restarted rank's old instance is retired
    caught_up = synthfill.fill(client, "r2", steps=1, world_size=2, ranks=[1], instance="B1", first_step=12,
                               time0_s=t0 + 32, meta=False)
    watched.tick()
    assert watched.held_note == "" and watched.held_records == 3
    view = watched.window.view("both", P2L, 4)
    assert view.step_T[-1] == 12 and watched.window.ranks_C[watched.window.ordered_slots()[-1]] == 2
    assert caught_up and watched.bad_records == 0


def test_most_ranks_restarting_start_a_fresh_window(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 60
    for rank in range(3):
        synthfill.fill(client, "r3", steps=10, world_size=3, ranks=[rank], instance=f"A{rank}", time0_s=t0,
                       meta=rank == 0)
    watched = WatchedRun(RedisSource(client, redis_url, "r3", window_steps=50), window_steps=50, deadline_s=0.0)
    watched.tick()
    for rank in range(2):  # two of three restart: most
        synthfill.fill(client, "r3", steps=2, world_size=3, ranks=[rank], instance=f"B{rank}", time0_s=t0 + 30,
                       meta=False)
    watched.tick()
    assert watched.restarts == 1 and "collector restarted at" in watched.restart_note, watched.last_error
    # rank 0's records came first and were held; the new epoch takes them in (nothing is lost)
    assert list(watched.window.view("both", P2L, 4, now_s=time.time() + 60).step_T) == [0, 1]
    assert list(watched.window.ranks_C[watched.window.ordered_slots()]) == [2, 2]
    assert watched.held_records == 0 and watched.instance_of_rank == {0: "B0", 1: "B1"}


def test_a_huge_step_id_and_a_world_claim_do_not_pin_the_window(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    t0 = time.time() - 60
    synthfill.fill(client, "r4", steps=10, world_size=2, ranks=[0, 1], instance="A", time0_s=t0)
    watched = WatchedRun(RedisSource(client, redis_url, "r4", window_steps=50), window_steps=50, deadline_s=0.0)
    watched.tick()
    synthfill.fill(client, "r4", steps=1, world_size=2, ranks=[0], instance="A", first_step=4_600_000_000_000_000_000,
                   time0_s=t0 + 20, meta=False)
    synthfill.fill(client, "r4", steps=1, world_size=65_536, ranks=[1], instance="A", first_step=10,
                   time0_s=t0 + 21, meta=False)
    synthfill.fill(client, "r4", steps=1, world_size=2, ranks=[0], instance="A", first_step=10, time0_s=t0 + 21,
                   meta=False)
    watched.tick()
    assert watched.bad_records == 1 and watched.missed_steps == 0 and watched.world_claims == 1
    assert watched.window.newest_step == 10 and watched.world_size == 2
    assert watched.window.ranks_C[watched.window.ordered_slots()[-1]] == 2

"""A new session starts from another session's copy of a live run (dashboard.live.seeds) against a real
redis-server: the copy polls on to the same window a fresh read gives, never changes the kept copy, and a run
written afresh under the same name (or a copy too old) is read afresh."""
import time

import numpy as np

from moe_monitor import core
from moe_monitor.core import membudget
from moe_monitor.dashboard.live.seeds import BUDGET_SHARE, Seeds
from moe_monitor.dashboard.live.watched import WatchedRun
from moe_monitor.dashboard.live.window import StepWindow
from moe_monitor.dashboard.sources.redis import RedisSource
from tests.support import synthfill

WINDOW = 50


def _watch(url: str, run: str) -> WatchedRun:
    watched = WatchedRun(RedisSource(core.connect(url, timeout_s=2.0), url, run, WINDOW), WINDOW)
    watched.tick()
    return watched


def _rows(watched: WatchedRun) -> tuple[np.ndarray, np.ndarray]:
    window = watched.window
    slots = window.ordered_slots()
    return window.step_C[slots], window.counts_CLE[slots]


def _write(client, run: str, first: int, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for step in range(first, first + steps):
        counts = rng.integers(0, 50, size=(4, 16)).astype(np.int32)
        client.xadd(core.steps_key(run), core.encode_step(core.StepRecord(
            run=run, rank=0, world_size=1, step=step, time_s=time.time(), phase="decode",
            tokens=int(counts.sum()), counts_LE=counts)))


def test_a_copy_polls_on_to_what_a_fresh_read_gives(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "seeded", steps=30)
    owner, seeds = _watch(redis_url, "seeded"), Seeds()
    seeds.offer(("k",), owner)
    _write(client, "seeded", 30, 40, seed=1)  # 70 steps: the window of 50 moves on
    given = seeds.take(("k",))
    assert given is not None and given is not owner and given.source.client is owner.source.client
    assert np.array_equal(_rows(given)[0], _rows(owner)[0])
    given.tick()
    fresh = _watch(redis_url, "seeded")
    (steps, counts), (want_steps, want_counts) = _rows(given), _rows(fresh)
    assert list(steps) == list(want_steps) == list(range(20, 70))
    assert np.array_equal(counts, want_counts)
    assert int(_rows(owner)[0][-1]) == 29  # the owner and the kept copy did not move
    again = seeds.take(("k",))
    assert again is not None and int(_rows(again)[0][-1]) == 29


def test_a_run_written_afresh_under_the_same_name_is_read_afresh(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "again", steps=30)
    seeds = Seeds()
    seeds.offer(("k",), _watch(redis_url, "again"))
    client.delete(core.steps_key("again"))
    _write(client, "again", 0, 10, seed=2)
    assert seeds.take(("k",)) is None
    assert seeds.take(("k",)) is None  # and the copy is dropped


def test_a_copy_too_old_or_of_no_run_is_not_given(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "old", steps=10)
    seeds = Seeds(max_age_s=0.0)
    seeds.offer(("k",), _watch(redis_url, "old"))
    assert seeds.take(("k",)) is None
    empty = WatchedRun(RedisSource(client, redis_url, "nothing", WINDOW), WINDOW)
    Seeds().offer(("n",), empty)  # no window yet: nothing kept
    assert Seeds().take(("n",)) is None


def test_a_copy_given_out_is_not_offered_back_before_it_ticks(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "back", steps=10)
    seeds = Seeds(every_s=0.0)
    seeds.offer(("k",), _watch(redis_url, "back"))
    kept = seeds._held[("k",)]
    given = seeds.take(("k",))
    seeds.offer(("k",), given)
    assert seeds._held[("k",)] is kept
    seeds.offer(("k",), given)  # the next run's offer is taken
    assert seeds._held[("k",)] is not kept


def test_no_copy_of_a_window_that_holds_much_of_what_the_budget_has_left(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "big", steps=10)
    need = StepWindow.step_bytes(4, 16) * WINDOW
    with membudget.using(membudget.MemoryBudget(3 * need)) as budget:
        watched = _watch(redis_url, "big")
        assert watched.window.reserved_bytes > BUDGET_SHARE * budget.available_bytes
        seeds = Seeds()
        seeds.offer(("k",), watched)
        assert seeds.take(("k",)) is None

"""A new session starts from another session's copy of a live run (dashboard.live.seeds) against a real
redis-server: the copy polls on to the same window a fresh read gives, never changes the kept copy, and a run
written afresh under the same name (or a copy too old) is read afresh; a copy too old to be given out gives its
memory budget back at the next offer or take, one session at a time copies a run, and a copy made mid-step
assembles that step with the ranks written after it."""
import threading
import time

import numpy as np

from moe_monitor import core
from moe_monitor.core import membudget
from moe_monitor.dashboard.live import seeds as seeds_module
from moe_monitor.dashboard.live.seeds import BUDGET_SHARE, MAX_AGE_S, Seeds, copy_bytes
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


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_copy_too_old_or_of_no_run_is_not_given(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "old", steps=10)
    clock = Clock()
    seeds = Seeds(clock=clock)
    seeds.offer(("k",), _watch(redis_url, "old"))
    clock.now_s += MAX_AGE_S  # as old as may be given out
    assert seeds.take(("k",)) is not None
    clock.now_s += 0.001
    assert seeds.take(("k",)) is None and seeds.held_keys() == []
    empty = WatchedRun(RedisSource(client, redis_url, "nothing", WINDOW), WINDOW)
    seeds.offer(("n",), empty)  # no window yet: nothing kept
    assert seeds.held_keys() == []
    assert seeds.take(("n",)) is None


def test_a_copy_too_old_gives_its_budget_back_at_the_next_offer_or_take_of_any_run(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    for run in ("a", "b", "c"):
        synthfill.fill(client, run, steps=20)
    clock = Clock()
    with membudget.using(membudget.MemoryBudget(256 << 20)) as budget:
        owners = {run: _watch(redis_url, run) for run in ("a", "b", "c")}
        sessions = budget.reserved_bytes
        seeds = Seeds(clock=clock)
        seeds.offer(("a",), owners["a"])
        one_copy = budget.reserved_bytes - sessions
        assert one_copy >= owners["a"].window.reserved_bytes > 0
        clock.now_s += MAX_AGE_S + 1
        assert seeds.take(("elsewhere",)) is None  # a take of another key drops it
        assert seeds.held_keys() == [] and budget.reserved_bytes == sessions
        seeds.offer(("b",), owners["b"])
        clock.now_s += MAX_AGE_S + 1
        seeds.offer(("c",), owners["c"])  # and so does an offer of another key
        assert seeds.held_keys() == [("c",)] and budget.reserved_bytes == sessions + one_copy
        assert all(owner.window.reserved_bytes > 0 for owner in owners.values())  # the sessions' own windows
        seeds.clear()
        assert budget.reserved_bytes == sessions


def test_one_session_at_a_time_copies_a_run(redis_url, monkeypatch):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "busy", steps=10)
    first, second = _watch(redis_url, "busy"), _watch(redis_url, "busy")
    copying, go_on, copies = threading.Event(), threading.Event(), []
    real_copy = seeds_module._copy

    def slow_copy(watched):
        copies.append(watched)
        copying.set()
        go_on.wait(timeout=30)
        return real_copy(watched)

    monkeypatch.setattr(seeds_module, "_copy", slow_copy)
    seeds = Seeds(every_s=0.0)
    offering = threading.Thread(target=seeds.offer, args=(("k",), first))
    offering.start()
    assert copying.wait(timeout=30)
    seeds.offer(("k",), second)  # the first is copying the run: no second copy
    assert copies == [first] and seeds.held_keys() == []
    go_on.set()
    offering.join(timeout=30)
    assert not offering.is_alive() and seeds.held_keys() == [("k",)]


def test_the_budget_share_counts_the_gpu_readings_a_copy_holds(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "gpus", steps=10)
    need = StepWindow.step_bytes(4, 16) * WINDOW
    with membudget.using(membudget.MemoryBudget(8 * need)) as budget:
        watched = _watch(redis_url, "gpus")
        assert copy_bytes(watched) < BUDGET_SHARE * budget.available_bytes
        seeds = Seeds(every_s=0.0)
        seeds.offer(("k",), watched)
        assert seeds.held_keys() == [("k",)]
        gpu = {"index": 0, "name": "H100", "sm_clock_mhz": 1980, "power_usage_w": 400.0, "temperature_c": 60,
               "gpu_utilization_percent": 90, "memory_used_bytes": 1 << 30}
        for i in range(watched.gpus.max_samples):
            watched.gpus.add(core.GpuSample(rank=0, host="h", time_s=float(i), status="ok", gpus=[dict(gpu)]))
        assert copy_bytes(watched) > BUDGET_SHARE * budget.available_bytes > watched.window.reserved_bytes
        seeds.clear()
        seeds.offer(("k",), watched)
        assert seeds.held_keys() == []


def test_a_copy_made_mid_step_assembles_that_step_with_the_ranks_written_after_it(redis_url):
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "mid", steps=10, world_size=2)
    rank0 = synthfill.fill(client, "mid", steps=1, first_step=10, world_size=2, ranks=[0], meta=False, seed=3)[0]
    owner = _watch(redis_url, "mid")  # rank 0 of step 10 read, waiting for rank 1
    assert owner.assembler.pending_steps == 1 and not owner.window.holds(10)
    seeds = Seeds()
    seeds.offer(("k",), owner)

    def step_10(watched: WatchedRun) -> tuple[int, np.ndarray]:
        window = watched.window
        slot = int(window.ordered_slots()[-1])
        assert int(window.step_C[slot]) == 10
        return int(window.ranks_C[slot]), window.counts_CLE[slot]

    early = seeds.take(("k",))  # polls before rank 1 is written, its copy older than the deadline
    early.assembler.deadline_s = 0.0
    early.tick()
    assert step_10(early)[0] == 1  # written short at its deadline, as the aggregator would
    rank1 = synthfill.fill(client, "mid", steps=1, first_step=10, world_size=2, ranks=[1], meta=False, seed=4)[0]
    late = seeds.take(("k",))  # a copy older than the deadline: rank 1 is in its first poll
    late.assembler.deadline_s = 0.0
    for watched in (late, early):  # the early one takes rank 1 as a late entry into the row
        watched.tick()
        ranks, counts = step_10(watched)
        assert ranks == 2 and np.array_equal(counts, rank0 + rank1)


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


def test_a_session_short_of_rows_drops_the_copies_first(redis_url):
    """Room for the copy (within BUDGET_SHARE of what is free) but not for it and a window of 4 more: the new rows
    come from the copy, dropped by the budget's relief (without it, the window got fewer rows than it asked)."""
    client = core.connect(redis_url, timeout_s=2.0)
    synthfill.fill(client, "a", steps=20)
    with membudget.using(membudget.MemoryBudget(256 << 20)) as probe:
        held = _watch(redis_url, "a")
        one_window = probe.reserved_bytes
        del held
    seeds = Seeds()
    with membudget.using(membudget.MemoryBudget(int(one_window * 5.2))) as budget:
        owner = _watch(redis_url, "a")
        seeds.offer(("a",), owner)
        assert seeds.held_keys() == [("a",)] and budget.available_bytes < 4 * one_window
        rows = 4 * owner.window.capacity
        got = budget.reserve_rows(owner.window.reserved_bytes // owner.window.capacity, rows)
        assert got is not None and got[1] == rows, "the copy was not given back"
        assert seeds.held_keys() == [] and owner.window.reserved_bytes > 0
